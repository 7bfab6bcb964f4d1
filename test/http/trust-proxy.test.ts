/**
 * TRUST_PROXY (DECISIONS 27), over real sockets: the access
 * line carries the client address, taken from X-Forwarded-For only when the
 * peer is a trusted proxy; otherwise the socket's own address.
 */
import { Writable } from 'node:stream'
import t, { type Test } from 'tap'
import { request } from 'undici'
import { build } from '../helpers/app.js'

async function accessLine (
  t: Test,
  env: Record<string, string>,
  forwardedFor: string
): Promise<Record<string, unknown> | undefined> {
  const lines: Array<Record<string, unknown>> = []
  const stream = new Writable({
    write (chunk, _enc, cb) {
      lines.push(JSON.parse(String(chunk)) as Record<string, unknown>)
      cb()
    }
  })
  const { url } = await build(t, { env, logger: { level: 'info', stream } })
  const res = await request(`${url}/ping`, { headers: { 'x-forwarded-for': forwardedFor, 'x-request-id': 'r-ip' } })
  t.equal(res.statusCode, 200)
  await res.body.dump()
  // The access line is written when the answer has gone: wait for it, not for a clock.
  for (let i = 0; i < 100 && !lines.some((l) => l.msg === 'request'); i++) { await new Promise((resolve) => setImmediate(resolve)) }
  return lines.find((l) => l.msg === 'request' && l.reqId === 'r-ip')
}

t.test('from a trusted peer, the forwarded client address is logged', async (t) => {
  t.match(await accessLine(t, { TRUST_PROXY: '127.0.0.1' }, '203.0.113.7'), {
    method: 'GET',
    url: '/ping',
    ip: '203.0.113.7',
    status: 200
  })
  // A chain: the rightmost address that is not a trusted proxy is the client.
  t.match(await accessLine(t, { TRUST_PROXY: '10.0.0.0/8, 127.0.0.0/8' }, '198.51.100.9, 203.0.113.7, 10.1.2.3'), {
    ip: '203.0.113.7'
  })
  t.match(await accessLine(t, { TRUST_PROXY: '::1,127.0.0.1/32' }, '2001:db8::5'), { ip: '2001:db8::5' })
})

t.test('from an untrusted peer, or with TRUST_PROXY unset, the socket address is logged', async (t) => {
  t.match(await accessLine(t, {}, '203.0.113.7'), { ip: '127.0.0.1' })
  t.match(await accessLine(t, { TRUST_PROXY: '10.0.0.0/8' }, '203.0.113.7'), { ip: '127.0.0.1' })
})
