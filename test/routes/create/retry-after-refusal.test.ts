/**
 * DECISIONS 23: a create's upload place (and its engine connection) is
 * given back when its answer is sent, not when the lingering read of its
 * unread body ends. A client refused with 400 whose body is still arriving
 * slowly fixes its form and retries at once, twice in parallel: both 200.
 */
import { once } from 'node:events'
import { connect } from 'node:net'
import t from 'tap'
import { startStubUpstream } from '../../../fixtures/stub-upstream.js'
import { build, hs256 } from '../../helpers/app.js'
import { CREATE_FIELDS, imagePart, multipartBody, pngOfSize } from '../../helpers/multipart.js'
import { viaRawSocket } from '../../helpers/write-first.js'

const SUB = 'retrying'
const MiB = 1024 * 1024

t.test('a 400 while the body still trickles in, then two valid creates of the same user at once: both 200', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url, env: { UPLOAD_MAX_PER_USER: '2', UPLOAD_MAX_CONNECTIONS: '2' } })
  // A name too long, then a 4 MiB image sent 16 KiB every 50 ms: the 400 comes from the first part.
  const bad = multipartBody([{ name: 'name', value: 'x'.repeat(40) }, { name: 'type', value: 'PORTFOLIO' }, imagePart(pngOfSize(4 * MiB))])
  const socket = connect(Number(new URL(url).port), '127.0.0.1')
  t.teardown(() => socket.destroy())
  await once(socket, 'connect')
  let answer = ''
  socket.setEncoding('latin1').on('data', (chunk: string) => { answer += chunk })
  socket.on('error', () => {})
  socket.write(`POST /api/portfolio/create HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${hs256({ sub: SUB })}\r\ncontent-type: ${bad.contentType}\r\ncontent-length: ${bad.body.length}\r\n\r\n`)
  socket.write(bad.body.subarray(0, 64 * 1024))
  let sent = 64 * 1024
  const trickle = setInterval(() => {
    if (sent >= bad.body.length || socket.destroyed) return
    socket.write(bad.body.subarray(sent, sent + 16 * 1024))
    sent += 16 * 1024
  }, 50)
  t.teardown(() => clearInterval(trickle))
  while (!answer.includes('\r\n\r\n{')) await new Promise((resolve) => setTimeout(resolve, 10))
  t.match(answer, /^HTTP\/1\.1 400 Bad Request\r\n[^]*connection: close\r\n/, 'the 400 came while the body was still arriving')
  t.ok(sent < bad.body.length, 'and the body is still arriving: the gateway lingers, reading it')

  const fixed = multipartBody([...CREATE_FIELDS, imagePart(pngOfSize(MiB))])
  const retry = { path: '/api/portfolio/create', headers: { authorization: `Bearer ${hs256({ sub: SUB })}`, 'content-type': fixed.contentType }, body: fixed.body }
  const [a, b] = await Promise.all([viaRawSocket(url, retry), viaRawSocket(url, retry)])
  t.equal(a.status, 200, a.body ?? a.error ?? '')
  t.equal(b.status, 200, b.body ?? b.error ?? '')
  t.match(JSON.parse(a.body!), { portfolio_id: /\S/ })
  t.match(JSON.parse(b.body!), { portfolio_id: /\S/ })
  t.ok(sent < bad.body.length, 'all while the refused body was still arriving')
})
