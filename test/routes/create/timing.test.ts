/**
 * Upload timing, over real sockets against the stub engine:
 * queue time counts for a streamed create, the upload clock stops at the
 * engine's response headers, an already-aborted call sends nothing, and the
 * reference engine waits at least as long for an upload as the gateway does.
 */
import { readFileSync } from 'node:fs'
import { PassThrough } from 'node:stream'
import t from 'tap'
import { request } from 'undici'
import { PNG_IMAGE } from '../../../fixtures/images.js'
import { startStubUpstream } from '../../../fixtures/stub-upstream.js'
import { Env } from '../../../schemas/env.js'
import { EngineClient } from '../../../src/engine-client/client.js'
import { GatewayError } from '../../../src/http/errors.js'
import { SERVER_LIMITS } from '../../../src/http/limits.js'
import { buildEngine, ENGINE_REQUEST_TIMEOUT_MS } from '../../../src/reference-engine/engine.js'
import { bearer, build } from '../../helpers/app.js'
import { eventually } from '../../helpers/engine.js'
import { multipartBody, type MultipartPart } from '../../helpers/multipart.js'

const PNG = readFileSync(PNG_IMAGE)
const FORM: MultipartPart[] = [
  { name: 'name', value: 'Blue chips' },
  { name: 'type', value: 'PORTFOLIO' },
  { name: 'image', filename: 'a.png', contentType: 'image/png', data: PNG }
]

const post = (url: string, body: Buffer | PassThrough, contentType: string) =>
  request(`${url}/api/portfolio/create`, { method: 'POST', headers: { ...bearer(), 'content-type': contentType }, body })

t.test('a streamed create waiting for a pool connection times out after UPSTREAM_TIMEOUT_MS', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url, engineConnections: 1, env: { UPSTREAM_TIMEOUT_MS: '300' } })
  const { body, contentType } = multipartBody(FORM)
  // A slow client holds the pool's one connection: its upload has begun and waits on the client, not the engine.
  const slow = new PassThrough()
  const holding = post(url, slow, contentType)
  slow.write(body.subarray(0, body.length - 10))
  t.ok(await eventually(() => stub.stats.started === 1, 10_000), 'the first upload holds the engine connection')

  const started = Date.now()
  const queued = await post(url, body, contentType)
  t.equal(queued.statusCode, 504, 'the queued create is given up on')
  t.same(await queued.body.json(), { error: 'portfolio engine timed out' })
  t.ok(Date.now() - started >= 280, 'not before UPSTREAM_TIMEOUT_MS')
  t.equal(stub.stats.started, 1, 'the queued create never reached the engine')

  slow.end(body.subarray(body.length - 10))
  const first = await holding
  t.equal(first.statusCode, 200, 'the slow client, who waited on nobody but itself, is served')
  await first.body.dump()
})

t.test('the upload clock stops at the response headers: a slower body is not a 504', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  // Headers after 600 ms and the body 600 ms later: each wait is within the
  // 1000 ms UPSTREAM_TIMEOUT_MS (undici's bodyTimeout watches the second),
  // but together they pass it, which the upload clock used to count.
  stub.handle((_req, res) => {
    const timer = setTimeout(() => {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.flushHeaders()
      const later = setTimeout(() => res.end(JSON.stringify({ portfolio_id: 'p-late' })), 600)
      res.on('close', () => clearTimeout(later))
    }, 600)
    res.on('close', () => clearTimeout(timer))
  })
  const { url } = await build(t, { upstreamUrl: stub.url, env: { UPSTREAM_TIMEOUT_MS: '1000' } })
  const { body, contentType } = multipartBody(FORM)
  const started = Date.now()
  const res = await post(url, body, contentType)
  t.equal(res.statusCode, 200)
  t.same(await res.body.json(), { portfolio_id: 'p-late' })
  t.ok(Date.now() - started >= 1150, 'the answer came after headers and body, past UPSTREAM_TIMEOUT_MS in all')
})

t.test('an already-aborted signal: the call rejects at once with its reason, nothing is sent', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const engine = new EngineClient({ url: stub.url, timeoutMs: 60_000 })
  t.teardown(() => engine.close())
  const aborted = new AbortController()
  const reason = new GatewayError('UPSTREAM_TIMEOUT', 'portfolio engine timed out')
  aborted.abort(reason)
  await t.rejects(engine.call({ method: 'GET', path: '/api/portfolio/ping', requestId: 'r', signal: aborted.signal }), reason)
  // A call after it is served on a fresh connection: the aborted one opened none.
  const after = await engine.call({ method: 'GET', path: '/api/portfolio/ping', requestId: 'r2' })
  t.equal(after.status, 200)
  t.equal(stub.stats.started, 1, 'only the second call reached the engine')
  t.same(stub.requests.map((r) => r.headers['x-request-id']), ['r2'])
})

t.test('the reference engine waits for an upload at least as long as the gateway allows it', async (t) => {
  const upstreamTimeoutMax = Number(Env.properties.UPSTREAM_TIMEOUT_MS.maximum)
  t.equal(upstreamTimeoutMax, 600_000)
  t.equal(SERVER_LIMITS.requestTimeoutMs, 180_000)
  t.equal(ENGINE_REQUEST_TIMEOUT_MS, 780_000)
  const engine = await buildEngine({ imageDir: t.testdir({}) })
  t.teardown(() => engine.close())
  await engine.ready()
  t.equal(engine.server.requestTimeout, ENGINE_REQUEST_TIMEOUT_MS, 'the server is set from it')
  t.ok(engine.server.requestTimeout >= SERVER_LIMITS.requestTimeoutMs + upstreamTimeoutMax, '180 s receiving + the longest UPSTREAM_TIMEOUT_MS')
})
