/** The server side of "bounded time": every Node server limit is set, none left at its default. */
import { connect } from 'node:net'
import t from 'tap'
import { SERVER_LIMITS } from '../src/app.js'
import { build } from './helpers/app.js'

t.test('server timeouts and header limits are the configured ones', async (t) => {
  const { app } = await build(t)
  t.equal(app.server.requestTimeout, SERVER_LIMITS.requestTimeoutMs)
  t.equal(app.server.headersTimeout, SERVER_LIMITS.headersTimeoutMs)
  t.equal(app.server.keepAliveTimeout, SERVER_LIMITS.keepAliveTimeoutMs)
  t.equal(app.server.timeout, SERVER_LIMITS.connectionTimeoutMs)
  t.equal(app.server.maxHeadersCount, SERVER_LIMITS.maxHeaderCount)
})

t.test('headers past maxHeadersCount are dropped unparsed; the request is still answered', async (t) => {
  const { url } = await build(t)
  const { port } = new URL(url)
  const socket = connect(Number(port), '127.0.0.1')
  const extra = Array.from({ length: SERVER_LIMITS.maxHeaderCount + 10 }, (_, i) => `x-h${i}: v`).join('\r\n')
  socket.write(`GET /ping HTTP/1.1\r\nHost: x\r\n${extra}\r\nConnection: close\r\n\r\n`)
  const chunks: Buffer[] = []
  socket.on('data', (c: Buffer) => chunks.push(c))
  await new Promise((resolve) => socket.on('close', resolve))
  // Node drops headers past maxHeadersCount instead of failing: the request is answered, with the extra headers unseen.
  t.match(Buffer.concat(chunks).toString(), /^HTTP\/1\.1 200 OK/)
  const res = await fetch(`${url}/ping`)
  t.equal(res.status, 200)
})
