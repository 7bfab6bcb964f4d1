/**
 * A create still streaming when the server's request timeout cuts it: the client is told 408, so the engine
 * must never complete it. Node checks the request timeout every second (connectionsCheckingInterval); the
 * test shortens app.server.requestTimeout, as the real 180 s is far too long for a test. The client keeps
 * sending after the server's FIN (allowHalfOpen), as a write-first client does: a connection that lingered
 * after the 408 instead of ending would feed the rest of the body to the create, and the engine would get it.
 */
import { once } from 'node:events'
import { connect } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { startStubUpstream } from '../../../fixtures/stub-upstream.js'
import { bearer, build } from '../../helpers/app.js'
import { CREATE_FIELDS, imagePart, multipartBody, pngOfSize } from '../../helpers/multipart.js'

const KiB = 1024

t.test('a create cut by the request timeout mid-upload gets its 408 and never completes at the engine', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { app, url } = await build(t, { upstreamUrl: stub.url })
  app.server.headersTimeout = 500
  app.server.requestTimeout = 1000
  const { body, contentType } = multipartBody([...CREATE_FIELDS, imagePart(pngOfSize(1024 * KiB))])
  const { port } = new URL(url)
  const socket = connect({ port: Number(port), host: '127.0.0.1', allowHalfOpen: true })
  await once(socket, 'connect')
  let received = ''
  socket.on('data', (c: Buffer) => { received += c.toString('latin1') })
  socket.on('error', () => {})
  // Not once(): a write into the ended connection fails (EPIPE), which once() would take for the outcome.
  const closed = new Promise((resolve) => socket.once('close', resolve))
  socket.write('POST /api/portfolio/create HTTP/1.1\r\nhost: gateway\r\n' +
    `authorization: ${bearer().authorization}\r\ncontent-type: ${contentType}\r\n` +
    `content-length: ${body.length}\r\nx-request-id: r-timeout-create\r\n\r\n`)
  // 16 KiB every 50 ms: the body takes about 3.2 s, past the 1 s timeout, and keeps the minimum rate.
  for (let sent = 0; sent < body.length && !socket.destroyed; sent += 16 * KiB) {
    socket.write(body.subarray(sent, sent + 16 * KiB))
    await sleep(50)
  }
  // The whole body went out: the connection was not ended. Half-closing lets a linger end.
  socket.end()
  await closed
  t.match(received, /^HTTP\/1\.1 408 Request Timeout\r\n/)
  t.match(received, /\r\nx-request-id: r-timeout-create\r\n/)
  t.match(received, /\r\n\r\n\{"error":"request timed out"\}$/, 'the raw 408 is the only answer on the connection')
  t.equal(stub.stats.started, 1, 'the engine request had started')
  t.equal(stub.requests.length, 0, 'and never completed: the client was told it failed')
})
