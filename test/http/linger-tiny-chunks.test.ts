/**
 * A lingering chunked body is read raw, not through Node's HTTP parser
 * (docs/decisions/0032-a-refused-upload-is-read-to-its-end.md): through the parser each chunk costs a callback, a
 * Buffer and an event, and a refused body of 1-byte chunks up to the bound cost seconds of CPU. Raw sockets,
 * allowHalfOpen so the server's FIN after its answer does not end their sending.
 */
import { once } from 'node:events'
import t from 'tap'
import { CREATE_BODY_MAX_BYTES } from '../../schemas/portfolio.js'
import { build, type Built } from '../helpers/app.js'
import { parseExposition, valueOf } from '../helpers/prometheus.js'
import { openRaw } from '../helpers/raw-client.js'

const HEAD = 'POST /api/portfolio/create HTTP/1.1\r\nhost: x\r\nauthorization: Bearer bad\r\n' +
  'content-type: multipart/form-data; boundary=b\r\ntransfer-encoding: chunked\r\n\r\n'

/** About 64 KiB of whole chunks of `size` bytes each. */
function chunks (size: number): Buffer {
  const one = Buffer.from(`${size.toString(16)}\r\n${'x'.repeat(size)}\r\n`)
  return Buffer.concat(Array<Buffer>(Math.max(1, Math.floor(65536 / one.length))).fill(one))
}

/**
 * A refused chunked create whose body, in chunks of `size` bytes, is sent as fast as the socket takes it until the
 * gateway cuts it at the bound: this process's CPU time meanwhile (the gateway's and the client's), and the answer.
 */
async function refusedAtFullSpeed (built: Built, size: number): Promise<{ cpuMs: number, read: number, text: string }> {
  const block = chunks(size)
  const { client, server, text } = await openRaw(t, built)
  const closed = once(server, 'close')
  let done = false
  void closed.then(() => { done = true })
  const before = process.cpuUsage()
  client.write(HEAD)
  while (!done && client.writable) {
    if (!client.write(block)) await Promise.race([once(client, 'drain').catch(() => {}), closed])
  }
  await closed
  const { user, system } = process.cpuUsage(before)
  return { cpuMs: (user + system) / 1000, read: server.bytesRead, text: text() }
}

const ended = async (built: Built, reason: string): Promise<number | undefined> =>
  valueOf(parseExposition((await built.metrics.scrape()).body), 'gateway_lingers_ended_total', { reason })

t.test('a refused body of 1-byte chunks costs about what one of 64 KiB chunks does, and ends at the bound', async (t) => {
  const built = await build(t)
  const bound = 2 * CREATE_BODY_MAX_BYTES
  const large = await refusedAtFullSpeed(built, 64 * 1024)
  const tiny = await refusedAtFullSpeed(built, 1)
  for (const run of [large, tiny]) {
    t.match(run.text, /^HTTP\/1\.1 401 Unauthorized\r\n/, 'the refusal went out first')
    t.ok(run.read > bound, `${run.read} bytes read: on to the bound (${bound})`)
    t.ok(run.read < bound + 4 * 65536, `${run.read} bytes read: not far past it`)
  }
  t.equal(await ended(built, 'over_bound'), 2, 'both cut at the bound')
  const allowed = 3 * large.cpuMs + 250
  t.ok(tiny.cpuMs < allowed,
    `1-byte chunks: ${tiny.cpuMs.toFixed(0)} ms of CPU, 64 KiB chunks: ${large.cpuMs.toFixed(0)} ms (at most ${allowed.toFixed(0)})`)
})

t.test('a refused chunked body sent whole is read to its end, which the client\'s FIN marks', async (t) => {
  const built = await build(t)
  const { client, server, text } = await openRaw(t, built)
  const closed = once(server, 'close')
  const body = Buffer.concat([chunks(1), chunks(1000), Buffer.from('0\r\n\r\n')])
  client.write(HEAD)
  client.end(body)
  await closed
  t.match(text(), /^HTTP\/1\.1 401 Unauthorized\r\n/)
  t.equal(server.bytesRead, HEAD.length + body.length, 'every byte read')
  t.equal(await ended(built, 'client_closed'), 1, 'ended by the client')
  t.equal(await ended(built, 'too_slow'), 0)
})
