/**
 * A chunked refused body declares nothing, so its linger reads at most twice the route's limit, counted from the
 * body's start (docs/decisions/0032-a-refused-upload-is-read-to-its-end.md): a create refused at the limit is read
 * to twice it, not to the limit and twice it again. And a lingering chunked body that stalls is cut, and counted.
 * Raw sockets, allowHalfOpen so the server's FIN after its answer does not end their sending.
 */
import { once } from 'node:events'
import t from 'tap'
import { CREATE_BODY_MAX_BYTES } from '../../schemas/portfolio.js'
import { startStubUpstream } from '../../fixtures/stub-upstream.js'
import { bearer, build, type Built } from '../helpers/app.js'
import { CREATE_FIELDS, imagePart, multipartBody, pngOfSize } from '../helpers/multipart.js'
import { parseExposition, valueOf } from '../helpers/prometheus.js'
import { openRaw } from '../helpers/raw-client.js'

const KiB = 1024
/** The most Node reads from a socket at once: the body's start is noted, and the cut comes, each at most one late. */
const ONE_READ = 64 * KiB

const ended = async (built: Built, reason: string): Promise<number | undefined> =>
  valueOf(parseExposition((await built.metrics.scrape()).body), 'gateway_lingers_ended_total', { reason })

t.test('a chunked create refused at its limit is read to twice the limit from the body\'s start, then cut', async (t) => {
  const engine = await startStubUpstream()
  t.teardown(async () => { await engine.close() })
  const built = await build(t, { upstreamUrl: engine.url })
  const { client, server, text } = await openRaw(t, built)
  const form = multipartBody([...CREATE_FIELDS, imagePart(pngOfSize(4 * CREATE_BODY_MAX_BYTES))])
  const head = 'POST /api/portfolio/create HTTP/1.1\r\nhost: x\r\n' +
    `authorization: ${bearer().authorization}\r\ncontent-type: ${form.contentType}\r\n` +
    'transfer-encoding: chunked\r\n\r\n'
  const serverClosed = once(server, 'close')
  let closed = false
  void serverClosed.then(() => { closed = true })
  client.write(head)
  let framing = 0
  for (let sent = 0; sent < form.body.length && !closed && client.writable; sent += 256 * KiB) {
    const data = form.body.subarray(sent, sent + 256 * KiB)
    const size = `${data.length.toString(16)}\r\n`
    framing += size.length + 2
    client.write(size)
    client.write(data)
    // once() rejects on the socket's EPIPE once the server cuts: that ends the loop, as the close does.
    if (!client.write('\r\n')) await Promise.race([once(client, 'drain').catch(() => {}), serverClosed])
  }
  await serverClosed
  const bound = 2 * CREATE_BODY_MAX_BYTES
  const read = server.bytesRead - head.length
  t.match(text(), /^HTTP\/1\.1 400 Bad Request\r\n/, 'the refusal went out first')
  t.match(text(), /"message":"image must be at most 10485760 bytes"/, 'refused at the image limit, 10 MiB in')
  t.ok(read <= bound + framing + 2 * ONE_READ, `${read} body bytes read: within the bound (${bound}) and two reads`)
  t.ok(read > bound - ONE_READ, `${read} body bytes read: the linger read on to the bound`)
  t.ok(read < 4 * CREATE_BODY_MAX_BYTES, 'the client could not send its whole body')
  t.equal(await ended(built, 'over_bound'), 1, 'counted as over the bound')
})

t.test('a lingering chunked body that stalls is cut, and counted as too slow', async (t) => {
  const built = await build(t, { uploadMinRate: { stallMs: 300, windowMs: 1_000, bytesPerS: 4096, tickMs: 100 } })
  const { client, server, text } = await openRaw(t, built)
  const serverClosed = once(server, 'close')
  client.write('POST /api/portfolio/create HTTP/1.1\r\nhost: x\r\nauthorization: Bearer bad\r\n' +
    'content-type: multipart/form-data; boundary=b\r\ntransfer-encoding: chunked\r\n\r\n400\r\n' + 'x'.repeat(1024) + '\r\n')
  await serverClosed
  t.match(text(), /^HTTP\/1\.1 401 Unauthorized\r\n/)
  t.equal(await ended(built, 'too_slow'), 1)
  t.equal(await ended(built, 'over_bound'), 0)
})
