/**
 * DECISIONS 21 over raw sockets: an answer that leaves body bytes unread ends
 * its connection and says so; Node's own parser errors get the simple shape,
 * an id and `connection: close`; while draining, every answer closes its
 * connection.
 */
import { once } from 'node:events'
import { createConnection, createServer, type AddressInfo, type Socket } from 'node:net'
import t, { type Test } from 'tap'
import { clientErrorAnswerer, clientErrorAnswer } from '../../src/http/client-error.js'
import { LINGER_LIMITS, Lingers } from '../../src/http/connection-close.js'
import { MinRate } from '../../src/routes/create/min-rate.js'
import { startStubUpstream } from '../../fixtures/stub-upstream.js'
import { build, hs256 } from '../helpers/app.js'

const lingerRate = new MinRate()
const answerClientError = clientErrorAnswerer(
  new Lingers(LINGER_LIMITS, (received, cut) => lingerRate.watchReceived(received, cut))
)

interface RawAnswer {
  status: number
  headers: Record<string, string>
  body: string
}

/** A socket to `url` that collects what the server sends and notes when the server ends it. */
async function open (
  url: string
): Promise<{ socket: Socket; answer: () => Promise<RawAnswer>; ended: Promise<unknown> }> {
  const { port } = new URL(url)
  const socket = createConnection(Number(port), '127.0.0.1')
  await once(socket, 'connect')
  let buffered = Buffer.alloc(0)
  let wake: () => void = () => {}
  socket.on('data', (chunk: Buffer) => {
    buffered = Buffer.concat([buffered, chunk])
    wake()
  })
  socket.on('error', () => {}) // the server may reset a socket we keep writing to: that is what is tested
  const ended = new Promise((resolve) => {
    socket.once('end', resolve)
    socket.once('close', resolve)
  })
  const answer = async (): Promise<RawAnswer> => {
    for (;;) {
      const head = buffered.indexOf('\r\n\r\n')
      if (head !== -1) {
        const [statusLine, ...lines] = buffered.subarray(0, head).toString('latin1').split('\r\n')
        const headers = Object.fromEntries(
          lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()])
        )
        const length = Number(headers['content-length'])
        if (buffered.length >= head + 4 + length) {
          const body = buffered.subarray(head + 4, head + 4 + length).toString('utf8')
          buffered = buffered.subarray(head + 4 + length)
          return { status: Number(statusLine!.split(' ')[1]), headers, body }
        }
      }
      await Promise.race([
        new Promise<void>((resolve) => {
          wake = resolve
        }),
        ended.then(() => {
          throw new Error(`socket ended with ${buffered.length} bytes unparsed`)
        })
      ])
    }
  }
  return { socket, answer, ended }
}

const chunk = (data: string): string => `${Buffer.byteLength(data).toString(16)}\r\n${data}\r\n`
const CHUNKED_POST = (path: string, auth = ''): string =>
  `POST ${path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n${auth}\r\n` +
  chunk('{"portfolio_id":"')

t.test('a 401 before the body is read: connection: close, and the server ends the socket', async (t) => {
  const { url } = await build(t)
  const { socket, answer, ended } = await open(url)
  socket.write(CHUNKED_POST('/api/portfolio/update'))
  const res = await answer()
  t.equal(res.status, 401)
  t.same(JSON.parse(res.body), { error: 'missing bearer token' })
  t.equal(res.headers.connection, 'close')
  t.match(res.headers['x-request-id'], /\S/)
  // The server ends its side at once (FIN after the answer) and reads on until the body ends (DECISIONS 21).
  await ended
  for (let i = 0; i < 8 && socket.writable; i++) socket.write(chunk('x'.repeat(16_384)))
  t.pass('the server ended its side of the connection')
})

t.test('a 404 on a POST whose body is still coming: connection: close', async (t) => {
  const { url } = await build(t)
  const { socket, answer, ended } = await open(url)
  socket.write(CHUNKED_POST('/api/nowhere', `authorization: Bearer ${hs256()}\r\n`))
  const res = await answer()
  t.equal(res.status, 404)
  t.equal(res.headers.connection, 'close')
  await ended
})

t.test('a complete request keeps its connection: two requests on one socket', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const { socket, answer } = await open(url)
  t.teardown(() => socket.destroy())
  const ping = `GET /api/portfolio/ping HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${hs256()}\r\n\r\n`
  socket.write(ping)
  const first = await answer()
  t.equal(first.status, 200)
  t.not(first.headers.connection, 'close')
  socket.write('GET /health HTTP/1.1\r\nhost: x\r\n\r\n')
  const second = await answer()
  t.equal(second.status, 200, 'the same socket serves the next request')
  // A 401 on a request with no body does not cost the connection either.
  socket.write('GET /api/portfolio/ping HTTP/1.1\r\nhost: x\r\n\r\n')
  const refused = await answer()
  t.equal(refused.status, 401)
  t.not(refused.headers.connection, 'close')
})

t.test('while draining, every answer says connection: close', async (t) => {
  const lifecycle = { draining: false }
  const { url } = await build(t, { lifecycle })
  const { socket, answer, ended } = await open(url)
  socket.write('GET /ping HTTP/1.1\r\nhost: x\r\n\r\n')
  t.not((await answer()).headers.connection, 'close')
  lifecycle.draining = true
  socket.write('GET /ping HTTP/1.1\r\nhost: x\r\n\r\n')
  const res = await answer()
  t.equal(res.status, 200)
  t.same(JSON.parse(res.body), { message: 'pong' })
  t.equal(res.headers.connection, 'close')
  await ended
})

t.test('Node parser errors: the simple shape, an id and connection: close', async (t) => {
  const { url } = await build(t)
  const cases: Array<[string, string, number, string]> = [
    [
      'headers too large',
      `GET /health HTTP/1.1\r\nhost: x\r\nx-big: ${'a'.repeat(20_000)}\r\n\r\n`,
      431,
      'request headers too large'
    ],
    ['malformed request line', 'GET /health HTTP/9.Z\r\n\r\n', 400, 'malformed HTTP request'],
    ['bad header characters', 'GET /health HTTP/1.1\r\nho st: x\r\n\r\n', 400, 'malformed HTTP request']
  ]
  for (const [what, raw, status, message] of cases) {
    const { socket, answer, ended } = await open(url)
    socket.write(raw)
    const res = await answer()
    t.equal(res.status, status, what)
    t.same(JSON.parse(res.body), { error: message }, what)
    t.equal(res.headers.connection, 'close', what)
    t.equal(res.headers['content-type'], 'application/json; charset=utf-8', what)
    t.match(res.headers['x-request-id'], /^[0-9a-f-]{36}$/, what)
    await ended
  }
})

t.test("Node's own answers (no Host, an unknown Expect): the simple shape and an id", async (t) => {
  const { url } = await build(t)
  const cases: Array<[string, string, number, string]> = [
    ['HTTP/1.1 without Host', 'GET /ping HTTP/1.1\r\n\r\n', 400, 'missing Host header'],
    [
      'POST without Host, body unread',
      'POST /api/portfolio/update HTTP/1.1\r\ncontent-length: 5\r\n\r\n',
      400,
      'missing Host header'
    ],
    [
      'Expect: foo',
      'GET /ping HTTP/1.1\r\nhost: x\r\nexpect: foo\r\n\r\n',
      417,
      'unsupported Expect header: only 100-continue is accepted'
    ]
  ]
  for (const [what, raw, status, message] of cases) {
    const { socket, answer } = await open(url)
    t.teardown(() => socket.destroy())
    socket.write(raw)
    const res = await answer()
    t.equal(res.status, status, what)
    t.same(JSON.parse(res.body), { error: message }, what)
    t.equal(res.headers['content-type'], 'application/json; charset=utf-8', what)
    t.match(res.headers['x-request-id'], /^[0-9a-f-]{36}$/, what)
  }
  // HTTP/1.0 needs no Host: served as before.
  const { socket, answer } = await open(url)
  t.teardown(() => socket.destroy())
  socket.write('GET /ping HTTP/1.0\r\n\r\n')
  t.equal((await answer()).status, 200)
})

/** A connected TCP pair on loopback, to drive the client-error handler on a real socket; `received` is what the client
 * read.
 */
async function socketPair (t: Test): Promise<{ client: Socket; serverSide: Socket; received: Buffer[] }> {
  const server = createServer()
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => server.close())
  const client = createConnection((server.address() as AddressInfo).port, '127.0.0.1')
  const [serverSide] = (await once(server, 'connection')) as [Socket]
  const received: Buffer[] = []
  client.on('data', (c: Buffer) => received.push(c))
  return { client, serverSide, received }
}

t.test('a request timeout (408) is answered the same way', async (t) => {
  // The server's own timeouts are minutes long; the handler is driven on a real socket pair instead.
  const { client, serverSide, received } = await socketPair(t)
  answerClientError(Object.assign(new Error('timeout'), { code: 'ERR_HTTP_REQUEST_TIMEOUT' }), serverSide)
  await once(client, 'end')
  const text = Buffer.concat(received).toString()
  t.match(text, /^HTTP\/1\.1 408 Request Timeout\r\n/)
  t.match(text, /\r\nconnection: close\r\n/)
  t.match(text, /\r\n\r\n\{"error":"request timed out"\}$/)
  client.destroy()
  t.equal(
    clientErrorAnswer('HPE_INVALID_METHOD', 'id-1'),
    'HTTP/1.1 400 Bad Request\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: 34\r\nx-request-id: id-1\r\nconnection: close\r\n\r\n{"error":"malformed HTTP request"}'
  )
})

t.test('a reset socket is left alone', async (t) => {
  const { client, serverSide, received } = await socketPair(t)
  answerClientError(Object.assign(new Error('reset'), { code: 'ECONNRESET' }), serverSide)
  t.equal(serverSide.writableLength + serverSide.bytesWritten, 0, 'nothing written or queued after a reset')
  serverSide.destroy()
  await once(client, 'close')
  t.same(received, [], 'the client read nothing')
})
