/**
 * Idempotency, create side (DECISIONS 16): the fingerprint
 * covers the whole form, also when the engine answered before the upload
 * ended. The stub engine here answers 400 (its structured error) as soon as a
 * request's headers arrive, before reading the body. The gateway then reads
 * and hashes the rest of the form (the client sends it anyway) before it
 * stores the record, so the identical retry gets the replay, not 422. A form
 * that cannot be read to its end stores nothing.
 */
import { once } from 'node:events'
import { connect } from 'node:net'
import t from 'tap'
import { request } from 'undici'
import { json, startStubUpstream, type StubHandler } from '../../../fixtures/stub-upstream.js'
import { bearer, build } from '../../helpers/app.js'
import { eventually } from '../../helpers/engine.js'
import { multipartBody } from '../../helpers/multipart.js'
import { pngOf } from '../../helpers/slow-upload.js'

const REFUSED = { success: false, error: { source: 'portfolio-engine', code: 'VALIDATION_ERROR', message: 'image refused by the engine', function: 'createPortfolio' } }
const refused: StubHandler = (_req, res) => json(res, 400, REFUSED)

// 4 MiB: far more than the engine reads before it answers.
const FORM = multipartBody([
  { name: 'name', value: 'Early' },
  { name: 'type', value: 'PORTFOLIO' },
  { name: 'image', filename: 'a.png', contentType: 'image/png', data: pngOf(4 * 1024 * 1024) },
  { name: 'description', value: 'after the image' }
])

async function create (url: string, key: string, form = FORM) {
  const res = await request(`${url}/api/portfolio/create`, {
    method: 'POST',
    headers: { ...bearer(), 'content-type': form.contentType, 'idempotency-key': key },
    body: form.body
  })
  return { status: res.statusCode, headers: res.headers, raw: Buffer.from(await res.body.arrayBuffer()) }
}

t.test('an engine that answers 400 after the first bytes: the identical retry gets the replay', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  stub.early = refused
  const { url } = await build(t, { upstreamUrl: stub.url, env: { UPSTREAM_TIMEOUT_MS: '5000' } })
  const first = await create(url, 'early-1')
  t.equal(first.status, 400)
  t.same(JSON.parse(first.raw.toString()), REFUSED, "the engine's answer")
  t.equal(stub.stats.started, 1)

  const retry = await create(url, 'early-1')
  t.equal(retry.status, 400, 'the stored status')
  t.equal(retry.headers['idempotent-replayed'], 'true')
  t.same(retry.raw, first.raw, 'the stored body, byte for byte')
  t.equal(stub.stats.started, 1, 'the retry did not reach the engine')

  // The fingerprint is the whole form's: a form that differs only after the engine answered is another request.
  const other = multipartBody([
    { name: 'name', value: 'Early' },
    { name: 'type', value: 'PORTFOLIO' },
    { name: 'image', filename: 'a.png', contentType: 'image/png', data: pngOf(4 * 1024 * 1024) },
    { name: 'description', value: 'something else' }
  ])
  const changed = await create(url, 'early-1', other)
  t.equal(changed.status, 422)
  t.same(JSON.parse(changed.raw.toString()), {
    success: false,
    error: { source: 'portfolio-gateway', code: 'IDEMPOTENCY_KEY_REUSED', message: 'this Idempotency-Key was used for a different request', function: 'createPortfolio' }
  })
})

t.test('an early answer whose form cannot be read to its end stores nothing', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  stub.early = refused
  const { url } = await build(t, { upstreamUrl: stub.url, env: { UPSTREAM_TIMEOUT_MS: '5000' } })
  // A client that sends 1 MiB of the 4 MiB form and hangs up.
  const { hostname, port } = new URL(url)
  const socket = connect(Number(port), hostname)
  t.teardown(() => socket.destroy())
  await once(socket, 'connect')
  socket.on('error', () => {})
  socket.write(`POST /api/portfolio/create HTTP/1.1\r\nhost: gateway\r\nauthorization: ${bearer().authorization}\r\ncontent-type: ${FORM.contentType}\r\nidempotency-key: early-2\r\ncontent-length: ${FORM.body.length}\r\n\r\n`)
  socket.write(FORM.body.subarray(0, 1024 * 1024))
  t.ok(await eventually(() => stub.stats.started === 1, 10_000), 'the engine answered the first bytes')
  socket.destroy()
  // The claim is released once the gateway sees the body end short: the retry is not 409 or a replay.
  let retry = await create(url, 'early-2')
  for (let i = 0; i < 50 && retry.status === 409; i++) {
    await new Promise((resolve) => setTimeout(resolve, 50))
    retry = await create(url, 'early-2')
  }
  t.equal(retry.status, 400, "the retry reaches the engine and gets the engine's answer")
  t.equal(retry.headers['idempotent-replayed'], undefined, 'not a replay: nothing was stored for the broken form')
  t.equal(stub.stats.started, 2)
})
