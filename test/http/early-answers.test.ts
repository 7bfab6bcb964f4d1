/**
 * DECISIONS 21 and 32: the lingering close after an early answer,
 * over raw sockets that keep sending (allowHalfOpen, so the server's FIN does
 * not stop them), with the minimum rate shortened through AppDeps. The real clients
 * (undici fetch, curl) against a gateway process: test/http/early-answers-clients.test.ts.
 */
import { once } from 'node:events'
import { connect, type Socket } from 'node:net'
import t from 'tap'
import { CREATE_BODY_MAX_BYTES } from '../../schemas/portfolio.js'
import { build, hs256, type Built } from '../helpers/app.js'
import { clearOfWindowEdge } from '../helpers/window.js'

interface RawUpload {
  socket: Socket
  /** What the server sent. */
  text: () => string
  /** The server's side of the connection closed; its bytesRead then. */
  serverClosed: Promise<number>
  /** The client saw a reset (EPIPE/ECONNRESET). */
  reset: () => boolean
}

/** A raw client that declares a body and keeps sending it, and the server's socket for it. */
async function rawUpload ({ app, url }: { app: Built['app'], url: string }, head: string): Promise<RawUpload> {
  const accepted = once(app.server, 'connection') as Promise<[Socket]>
  // allowHalfOpen: the server's FIN after its answer must not end the client's sending (Node's default would).
  const socket = connect({ port: Number(new URL(url).port), host: '127.0.0.1', allowHalfOpen: true })
  t.teardown(() => socket.destroy())
  const [server] = await accepted
  const serverClosed = once(server, 'close').then(() => server.bytesRead)
  let text = ''
  let reset = false
  socket.setEncoding('latin1').on('data', (c: string) => { text += c })
  socket.on('error', () => { reset = true })
  socket.write(head)
  return { socket, text: () => text, serverClosed, reset: () => reset }
}

const createHead = (length: number, extra = ''): string =>
  `POST /api/portfolio/create HTTP/1.1\r\nhost: x\r\nauthorization: Bearer bad\r\ncontent-type: multipart/form-data; boundary=b\r\ncontent-length: ${length}\r\n${extra}\r\n`

/** The uploads' minimum-rate rule, shortened: the linger follows it (DECISIONS 32). */
const FAST_RATE = { stallMs: 300, windowMs: 1_000, bytesPerS: 4096, tickMs: 100 }

t.test('a refused create declared at 50 MB, sent at full speed, is closed after the answer, not read', async (t) => {
  const built = await build(t, { uploadMinRate: FAST_RATE })
  const { socket, serverClosed, reset } = await rawUpload(built, createHead(50 * 1024 * 1024))
  const chunk = Buffer.alloc(64 * 1024, 0x61)
  let cut = false
  const closed = serverClosed.then((n) => { cut = true; return n })
  let sent = 0
  while (!cut && !reset() && sent < 50 * 1024 * 1024) {
    if (!socket.write(chunk)) await Promise.race([new Promise((resolve) => { socket.once('drain', resolve); socket.once('close', resolve) }), closed])
    sent += chunk.length
  }
  const read = await closed
  // Beyond twice the cap the body is never a photo a little too large: nothing of it is read after the answer.
  t.ok(read <= CREATE_BODY_MAX_BYTES, `the server read ${read} bytes, not past the limit (${CREATE_BODY_MAX_BYTES})`)
  t.ok(sent < 50 * 1024 * 1024, 'the client could not send its 50 MB')
})

t.test('a lingering connection is cut at the stall limit, and when it falls under the minimum rate', async (t) => {
  const built = await build(t, { uploadMinRate: FAST_RATE })

  const silent = await rawUpload(built, createHead(8 * 1024 * 1024) + 'x'.repeat(1024))
  const silentFrom = performance.now()
  await silent.serverClosed
  const silentMs = performance.now() - silentFrom
  t.match(silent.text(), /^HTTP\/1\.1 401 /)
  t.ok(silentMs >= 250 && silentMs < 3_000, `silent client cut after ~300 ms without a byte (${Math.round(silentMs)} ms)`)

  const trickle = await rawUpload(built, createHead(8 * 1024 * 1024))
  const trickleFrom = performance.now()
  const timer = setInterval(() => { if (trickle.socket.writable) trickle.socket.write('x'.repeat(100)) }, 50)
  t.teardown(() => clearInterval(timer))
  await trickle.serverClosed
  clearInterval(timer)
  const trickleMs = performance.now() - trickleFrom
  t.match(trickle.text(), /^HTTP\/1\.1 401 /)
  t.ok(trickleMs >= 900 && trickleMs < 5_000, `a 2 KB/s trickle is cut after 1 s (${Math.round(trickleMs)} ms)`)
})

t.test('a body sent to its end after an early answer: every byte is read, then the connection closes cleanly', async (t) => {
  const built = await build(t)
  const length = 3 * 1024 * 1024
  const head = createHead(length)
  const client = await rawUpload(built, head)
  const body = Buffer.alloc(length, 0x62)
  for (let at = 0; at < length; at += 256 * 1024) {
    const ok = client.socket.write(body.subarray(at, at + 256 * 1024))
    if (!ok) await once(client.socket, 'drain')
  }
  t.equal(await client.serverClosed, Buffer.byteLength(head) + length, 'the server closed once it had read every byte')
  await new Promise((resolve) => setTimeout(resolve, 50))
  t.equal(client.reset(), false, 'the client wrote its whole body without an error: no reset')
  t.match(client.text(), /^HTTP\/1\.1 401 Unauthorized\r\n[^]*\r\n\r\n\{"error":"invalid token"\}$/)
})

t.test('Expect: 100-continue: a refusal instead of 100 Continue; 100 Continue once auth and the rate limit pass', async (t) => {
  const built = await build(t, { env: { RATE_LIMIT_PER_MINUTE: '1' } })
  await clearOfWindowEdge()
  const ask = async (auth: string): Promise<string> => {
    const client = await rawUpload(built, `POST /api/portfolio/update HTTP/1.1\r\nhost: x\r\n${auth}content-type: application/json\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n`)
    // The body is not sent: a well-behaved client waits for 100 Continue or the answer.
    const deadline = Date.now() + 5_000
    while (!/\r\n\r\n/.test(client.text()) && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 10))
    const first = client.text()
    client.socket.destroy()
    return first
  }
  const refused = await ask('authorization: Bearer bad\r\n')
  t.match(refused, /^HTTP\/1\.1 401 Unauthorized\r\n/, '401 without 100 Continue')
  t.match(refused, /\r\nx-request-id: \S+\r\n/)
  const invited = await ask(`authorization: Bearer ${hs256()}\r\n`)
  t.match(invited, /^HTTP\/1\.1 100 Continue\r\n\r\n/, 'a valid token under the limit is invited to send its body')
  const limited = await ask(`authorization: Bearer ${hs256()}\r\n`)
  t.match(limited, /^HTTP\/1\.1 429 Too Many Requests\r\n/, 'past the rate limit: 429 without 100 Continue')
})

t.test('a request pipelined behind an early-answered body is not served on the closing connection', async (t) => {
  const built = await build(t)
  const client = await rawUpload(built, 'POST /api/portfolio/update HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 5\r\n\r\n')
  while (!/\r\n\r\n\{[^}]*\}/.test(client.text())) await new Promise((resolve) => setTimeout(resolve, 10))
  client.socket.write('{"a":GET /ping HTTP/1.1\r\nhost: x\r\n\r\n')
  await client.serverClosed
  t.equal(client.text().match(/HTTP\/1\.1 /g)?.length, 1, 'one answer: the 401')
})

t.test('a parser error: the 400 is read, what follows is drained, and the close is not a reset', async (t) => {
  const built = await build(t)
  // What follows stays within the bound: the route's body limit (update: 64 KiB), or create's when no route is known.
  const cases: Array<[string, string, RegExp, number]> = [
    ['a malformed header, the body still coming', 'POST /api/portfolio/update HTTP/1.1\r\nhost: x\r\nbad header\r\ncontent-length: 2000000\r\n\r\n',
      /^HTTP\/1\.1 400 Bad Request\r\n[^]*\r\n\r\n\{"error":"malformed HTTP request"\}$/, 256 * 1024],
    ['a 401 on its way when the chunked body turns out malformed', 'POST /api/portfolio/update HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n',
      /^HTTP\/1\.1 401 Unauthorized\r\n[^]*\r\n\r\n\{"error":"missing bearer token"\}$/, 12 * 1024]
  ]
  for (const [what, head, answer, chunkBytes] of cases) {
    const client = await rawUpload(built, head)
    while (!/\r\n\r\n\{[^}]*\}/.test(client.text())) await new Promise((resolve) => setTimeout(resolve, 10))
    t.match(client.text(), answer, what)
    // The client goes on writing what it had (a dead parser cannot tell a body from what follows), then ends.
    const more = Buffer.alloc(chunkBytes, 0x63)
    for (let i = 0; i < 4; i++) if (!client.socket.write(more)) await once(client.socket, 'drain')
    client.socket.end()
    const read = await client.serverClosed
    t.ok(read > 4 * more.length, `${what}: the server read what followed (${read} bytes) before closing`)
    await new Promise((resolve) => setTimeout(resolve, 50))
    t.equal(client.reset(), false, `${what}: no reset, every write of the client succeeded`)
  }
})
