/** The server side of "bounded time": every Node server limit is set, none left at its default. */
import { connect } from 'node:net'
import t from 'tap'
import { SERVER_LIMITS } from '../src/http/limits.js'
import { build } from './helpers/app.js'

t.test('server timeouts and header limits are the configured ones', async (t) => {
  const { app } = await build(t)
  t.equal(app.server.requestTimeout, SERVER_LIMITS.requestTimeoutMs)
  t.equal(app.server.headersTimeout, SERVER_LIMITS.headersTimeoutMs)
  t.equal(app.server.keepAliveTimeout, SERVER_LIMITS.keepAliveTimeoutMs)
  t.equal(app.server.timeout, SERVER_LIMITS.connectionTimeoutMs, 'UPSTREAM_TIMEOUT_MS=1000: the floor')
  t.equal(app.server.maxHeadersCount, SERVER_LIMITS.maxHeaderCount)
})

t.test('a long UPSTREAM_TIMEOUT_MS lengthens the idle limit, so the client is still there for the 504', async (t) => {
  const { app } = await build(t, { env: { UPSTREAM_TIMEOUT_MS: '120000' } })
  t.equal(app.server.timeout, 125_000)
})

t.test('headers past maxHeadersCount are dropped unparsed; the request is still answered', async (t) => {
  const { url } = await build(t)
  const { port } = new URL(url)
  const ask = async (position: number): Promise<string> => {
    const socket = connect(Number(port), '127.0.0.1')
    const filler = Array.from({ length: 100 }, (_, i) => `x-h${i}: v`)
    filler.splice(position, 0, 'x-request-id: mine')
    socket.write(`GET /ping HTTP/1.1\r\nHost: x\r\n${filler.join('\r\n')}\r\nConnection: close\r\n\r\n`)
    const chunks: Buffer[] = []
    socket.on('data', (c: Buffer) => chunks.push(c))
    await new Promise((resolve) => socket.on('close', resolve))
    return Buffer.concat(chunks).toString()
  }
  const early = await ask(10)
  t.match(early, /^HTTP\/1\.1 200 OK/)
  t.match(early, /x-request-id: mine\r\n/i, 'a header within the first 64 is read')
  const late = await ask(90)
  t.match(late, /^HTTP\/1\.1 200 OK/)
  t.notMatch(late, /x-request-id: mine\r\n/i, 'a header past the 64th is never parsed (Node\'s default would read 2000)')
})
