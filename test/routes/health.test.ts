/**
 * Liveness and connectivity (spec "GET /health", "GET /ping", "GET /api/health";
 * DECISIONS 11-12), over real sockets against a stub engine.
 */
import t, { type Test } from 'tap'
import { request } from 'undici'
import { faults, json, refusedPort, startStubUpstream, type StubHandler } from '../../fixtures/stub-upstream.js'
import { bearer, build } from '../helpers/app.js'

const ISO_TIMESTAMP = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/

async function get (
  url: string,
  headers: Record<string, string> = {}
): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await request(url, { headers })
  return { status: res.statusCode, body: (await res.body.json()) as Record<string, unknown> }
}

t.test('GET /health: ok, ISO timestamp, numeric uptime, no auth', async (t) => {
  const { url } = await build(t)
  const { status, body } = await get(`${url}/health`)
  t.equal(status, 200)
  t.same(Object.keys(body).sort(), ['status', 'timestamp', 'uptime'])
  t.equal(body['status'], 'ok')
  t.match(body['timestamp'], ISO_TIMESTAMP)
  t.ok(Math.abs(Date.parse(String(body['timestamp'])) - Date.now()) < 5_000, 'timestamp is now')
  t.type(body['uptime'], 'number')
  t.ok((body['uptime'] as number) > 0, 'uptime counts up from process start')
})

t.test('GET /health while draining: 500 shutting down', async (t) => {
  const lifecycle = { draining: false }
  const { url } = await build(t, { lifecycle })
  t.equal((await get(`${url}/health`)).status, 200, 'healthy before shutdown starts')
  lifecycle.draining = true
  t.same(await get(`${url}/health`), { status: 500, body: { status: 'error', message: 'shutting down' } })
})

t.test('GET /ping: pong, no auth', async (t) => {
  const { url } = await build(t)
  t.same(await get(`${url}/ping`), { status: 200, body: { message: 'pong' } })
})

const engineHealth =
  (database: string, cache: string): StubHandler =>
    (req, res) => {
      json(res, req.url === '/health' ? 200 : 404, { status: 'ok', services: { database, cache } })
    }

/** GET /api/health's body with the timestamp checked and then set aside, so the rest compares exactly. */
async function apiHealth (t: Test, url: string): Promise<{ status: number; body: Record<string, unknown> }> {
  const { status, body } = await get(`${url}/api/health`, bearer())
  t.match(body['timestamp'], ISO_TIMESTAMP, 'ISO timestamp')
  return { status, body: { ...body, timestamp: 'checked' } }
}

t.test('GET /api/health needs a bearer token', async (t) => {
  const { url } = await build(t)
  t.equal((await get(`${url}/api/health`)).status, 401)
})

t.test('GET /api/health: engine reports all connected -> ok', async (t) => {
  const stub = await startStubUpstream(engineHealth('connected', 'connected'))
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  t.same(await apiHealth(t, url), {
    status: 200,
    body: { status: 'ok', timestamp: 'checked', services: { database: 'connected', cache: 'connected' } }
  })
  t.equal(stub.requests.length, 1, 'one probe per call')
  t.match(stub.requests[0], { method: 'GET', url: '/health', headers: { 'x-user-id': 'alice' } })
})

t.test('GET /api/health: engine reports its cache disconnected -> degraded, values as reported', async (t) => {
  const stub = await startStubUpstream(engineHealth('connected', 'disconnected'))
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  t.same(await apiHealth(t, url), {
    status: 200,
    body: { status: 'degraded', timestamp: 'checked', services: { database: 'connected', cache: 'disconnected' } }
  })
})

t.test('GET /api/health: engine down -> 200 degraded, both disconnected', async (t) => {
  const { url } = await build(t, { upstreamUrl: `http://127.0.0.1:${await refusedPort()}` })
  t.same(await apiHealth(t, url), {
    status: 200,
    body: { status: 'degraded', timestamp: 'checked', services: { database: 'disconnected', cache: 'disconnected' } }
  })
})

t.test('GET /api/health: engine hangs -> answered within ~2 s even with a long UPSTREAM_TIMEOUT_MS', async (t) => {
  const stub = await startStubUpstream(faults.hang)
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url, env: { UPSTREAM_TIMEOUT_MS: '10000' } })
  const started = Date.now()
  const answer = await apiHealth(t, url)
  const elapsed = Date.now() - started
  t.same(answer, {
    status: 200,
    body: { status: 'degraded', timestamp: 'checked', services: { database: 'disconnected', cache: 'disconnected' } }
  })
  t.ok(
    elapsed >= 1_900 && elapsed < 8_000,
    `probe gave up at its 2 s cap, not at UPSTREAM_TIMEOUT_MS=10 s (${elapsed} ms)`
  )
})

const OUTSIDE_CONTRACT: Array<[string, StubHandler]> = [
  [
    'garbage JSON',
    (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end('{"status": "ok", "services": {')
    }
  ],
  ['JSON of another shape', faults.wrongShape],
  ['a 500', (_req, res) => json(res, 500, { status: 'ok', services: { database: 'connected', cache: 'connected' } })],
  ['bytes that are not HTTP', faults.garbage]
]

for (const [name, handler] of OUTSIDE_CONTRACT) {
  t.test(`GET /api/health: engine answers ${name} -> degraded, disconnected`, async (t) => {
    const stub = await startStubUpstream(handler)
    t.teardown(stub.close)
    const { url } = await build(t, { upstreamUrl: stub.url })
    t.same(await apiHealth(t, url), {
      status: 200,
      body: { status: 'degraded', timestamp: 'checked', services: { database: 'disconnected', cache: 'disconnected' } }
    })
  })
}

t.test('an /api/health probe that times out is counted as timeout, not unavailable', async (t) => {
  const stub = await startStubUpstream(faults.hang)
  t.teardown(stub.close)
  // UPSTREAM_TIMEOUT_MS 300: the probe's cap is min(300, 2000) ms.
  const { metrics, url } = await build(t, { upstreamUrl: stub.url, env: { UPSTREAM_TIMEOUT_MS: '300' } })
  const { status, body } = await get(`${url}/api/health`, bearer())
  t.equal(status, 200)
  t.equal(body['status'], 'degraded')
  t.same(body['services'], { database: 'disconnected', cache: 'disconnected' })
  const text = (await metrics.scrape()).body
  t.match(
    text,
    new RegExp(
      `gateway_engine_calls_total\\{call="health",outcome="timeout",endpoint="127\\.0\\.0\\.1:${stub.port}"\\} 1\\n`
    )
  )
  t.notMatch(text, /gateway_engine_calls_total\{call="health",outcome="unavailable"/)
})
