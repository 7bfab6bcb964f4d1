/**
 * DECISIONS 22: a refused or abandoned create never completes at the engine.
 * The stub engine here answers 200 `{ portfolio_id }` to any create whose
 * HTTP body completes, whatever the form holds (a lenient parser), and counts
 * requests that completed (`requests`) and those cut off mid-body
 * (`stats.aborted`). Every create below would store a portfolio at such an
 * engine if the gateway ended its request as a complete HTTP request.
 */
import { once } from 'node:events'
import { readFileSync } from 'node:fs'
import { connect } from 'node:net'
import t from 'tap'
import { request } from 'undici'
import { PNG_IMAGE } from '../../../fixtures/images.js'
import { startStubUpstream } from '../../../fixtures/stub-upstream.js'
import { bearer, build } from '../../helpers/app.js'
import { eventually } from '../../helpers/engine.js'
import { CREATE_FIELDS as BASE, createValidationError as err, imagePart as image, multipartBody, pngOfSize as bigPng, type MultipartPart } from '../../helpers/multipart.js'

const PNG = readFileSync(PNG_IMAGE)
const KiB = 1024
const MiB = 1024 * KiB

const REFUSED_MID_STREAM: Array<[string, MultipartPart[], string]> = [
  ['a bad field after the image', [BASE[1]!, image(bigPng(256 * KiB)), { name: 'name', value: '' }], 'name must be at least 1 character'],
  ['a missing field, found at the end of the form', [BASE[1]!, image(bigPng(256 * KiB))], 'name is required'],
  ['an oversized image', [...BASE, image(bigPng(10 * MiB + 1))], 'image must be at most 10485760 bytes'],
  ['a second image', [...BASE, image(bigPng(256 * KiB)), image(PNG)], 'image must be given once']
]

t.test('a form refused after its engine request began: the engine request is aborted, never completed', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  let started = 0
  for (const [name, parts, message] of REFUSED_MID_STREAM) {
    const { body, contentType } = multipartBody(parts)
    const res = await request(`${url}/api/portfolio/create`, { method: 'POST', headers: { ...bearer(), 'content-type': contentType }, body })
    t.equal(res.statusCode, 400, name)
    t.same(await res.body.json(), err(message), `${name}: the gateway's own 400`)
    started++
    t.ok(await eventually(() => stub.stats.started === started && stub.stats.aborted === started), `${name}: the engine saw its request begin and break off`)
    t.equal(stub.requests.length, 0, `${name}: no request completed at the engine`)
  }
  // A valid create after all that still completes: the pool recovered from the aborted sockets.
  const { body, contentType } = multipartBody([...BASE, image(PNG)])
  const ok = await request(`${url}/api/portfolio/create`, { method: 'POST', headers: { ...bearer(), 'content-type': contentType }, body })
  t.equal(ok.statusCode, 200)
  t.same(await ok.body.json(), { portfolio_id: 'p-stub-1' })
  t.equal(stub.requests.length, 1, 'only the valid form completed')
})

t.test('a body that breaks off mid-image (truncated form): aborted at the engine', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const { body, contentType } = multipartBody([...BASE, image(bigPng(512 * KiB))])
  // The HTTP body is complete; the form inside it stops in the middle of the image.
  const cut = body.subarray(0, 300 * KiB)
  const res = await request(`${url}/api/portfolio/create`, { method: 'POST', headers: { ...bearer(), 'content-type': contentType }, body: cut })
  t.equal(res.statusCode, 400)
  t.same(await res.body.json(), err('multipart body is malformed or truncated'))
  t.ok(await eventually(() => stub.stats.started === 1 && stub.stats.aborted === 1), 'the engine request began and broke off')
  t.equal(stub.requests.length, 0)
})

for (const where of ['in the image', 'after the image, before the form ends'] as const) {
  t.test(`a client that hangs up ${where}: the engine request is aborted`, async (t) => {
    const stub = await startStubUpstream()
    t.teardown(stub.close)
    const { url } = await build(t, { upstreamUrl: stub.url })
    const parts = where === 'in the image'
      ? [...BASE, image(bigPng(2 * MiB))]
      : [BASE[1]!, image(bigPng(256 * KiB)), { name: 'name', value: 'Almost' }]
    const { body, contentType } = multipartBody(parts)
    const sent = where === 'in the image' ? MiB : body.length - 40
    const { hostname, port } = new URL(url)
    const socket = connect(Number(port), hostname)
    t.teardown(() => socket.destroy())
    await once(socket, 'connect')
    socket.on('error', () => {})
    const answer: Buffer[] = []
    socket.on('data', (c: Buffer) => answer.push(c))
    socket.write(`POST /api/portfolio/create HTTP/1.1\r\nhost: gateway\r\nauthorization: ${bearer().authorization}\r\ncontent-type: ${contentType}\r\ncontent-length: ${body.length}\r\n\r\n`)
    socket.write(body.subarray(0, sent))
    t.ok(await eventually(() => stub.stats.bytes >= sent - 200 * KiB, 10_000), 'the upload is streaming to the engine')
    socket.destroy()
    t.ok(await eventually(() => stub.stats.aborted === 1), 'the engine request broke off')
    t.equal(stub.stats.started, 1)
    t.equal(stub.requests.length, 0, 'nothing completed at the engine')
    t.equal(Buffer.concat(answer).length, 0, 'the gateway had not answered: there was no one to answer')
  })
}
