/**
 * Metrics (DECISIONS 18) over real sockets: known traffic through a gateway
 * and a stub engine, then a scrape of the metrics listener, asserting exact
 * counts. The public port never serves /metrics.
 */
import t, { type Test } from 'tap'
import { request } from 'undici'
import { contractHandler, faults, json, refusedPort, startStubUpstream } from '../../fixtures/stub-upstream.js'
import { toGatewayError } from '../../src/http/error-handler.js'
import { GatewayError, validationError } from '../../src/http/errors.js'
import { GatewayMetrics } from '../../src/observability/metrics.js'
import { rejectionReason } from '../../src/observability/request-metrics.js'
import { startMetricsServer } from '../../src/observability/metrics-server.js'
import { bearer, build, validUpdate } from '../helpers/app.js'
import { parseExposition, scrape, valueOf } from '../helpers/prometheus.js'

async function gatewayWithMetrics (t: Test, upstreamUrl: string, env: Record<string, string> = {}) {
  const built = await build(t, { upstreamUrl, env })
  const metrics = await startMetricsServer(built.metrics, { port: 0, host: '127.0.0.1' })
  t.teardown(metrics.close)
  return { ...built, metricsUrl: `http://127.0.0.1:${metrics.port}` }
}

const ping = async (url: string, headers = bearer()) => {
  const res = await request(`${url}/api/portfolio/ping`, { headers })
  return { status: res.statusCode, body: await res.body.text() }
}
const update = async (url: string, body: unknown) => {
  const res = await request(`${url}/api/portfolio/update`, { method: 'POST', headers: { ...bearer(), 'content-type': 'application/json' }, body: JSON.stringify(body) })
  return { status: res.statusCode, body: await res.body.json() }
}

t.test('requests, rejections and engine calls after known traffic, with exact counts', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url, metricsUrl } = await gatewayWithMetrics(t, stub.url)

  for (let i = 0; i < 3; i++) t.same(await ping(url), { status: 200, body: 'pong' })
  t.equal((await ping(url, {})).status, 401, 'no token')
  t.equal((await update(url, { portfolio_id: 'p-1' })).status, 400, 'invalid body')
  const tooLarge = await request(`${url}/api/portfolio/update`, { method: 'POST', headers: { ...bearer(), 'content-type': 'application/json' }, body: 'x'.repeat(70 * 1024) })
  t.equal(tooLarge.statusCode, 400, 'body over the 64 KiB update limit')
  t.same(await tooLarge.body.json(), { success: false, error: { source: 'portfolio-gateway', code: 'VALIDATION_ERROR', message: 'body must be at most 65536 bytes', function: 'updatePortfolio' } })
  t.same(await update(url, validUpdate()), { status: 200, body: { success: true, message: 'Target positions updated' } })
  stub.handle((req, res) => json(res, 404, { success: false, error: { source: 'engine', code: 'NOT_FOUND', message: 'no such portfolio', function: 'updatePortfolio' } }))
  t.equal((await update(url, validUpdate())).status, 404, "the engine's own error passes through")
  stub.handle(faults.garbage)
  t.equal((await ping(url)).status, 502, 'not HTTP')
  stub.handle(faults.htmlError)
  t.equal((await ping(url)).status, 502, 'an HTML 500')
  stub.handle(faults.reset)
  t.equal((await ping(url)).status, 502, 'reset')
  stub.handle(contractHandler)
  const unknown = await request(`${url}/no/such/route/secret-123`)
  t.equal(unknown.statusCode, 404)
  await unknown.body.dump()

  const { status, contentType, samples, text } = await scrape(metricsUrl)
  t.equal(status, 200)
  t.match(contentType, /^text\/plain; version=0\.0\.4/)
  const requests = (route: string, method: string, statusClass: string) => valueOf(samples, 'gateway_requests_total', { route, method, status_class: statusClass })
  t.equal(requests('/api/portfolio/ping', 'GET', '2xx'), 3)
  t.equal(requests('/api/portfolio/ping', 'GET', '4xx'), 1)
  t.equal(requests('/api/portfolio/ping', 'GET', '5xx'), 3)
  t.equal(requests('/api/portfolio/update', 'POST', '4xx'), 3, '400, 400, 404')
  t.equal(requests('/api/portfolio/update', 'POST', '2xx'), 1)
  t.equal(requests('unmatched', 'GET', '4xx'), 1, 'an unknown route under one fixed label')
  t.notMatch(text, /secret-123|no\/such/, 'never the raw URL')
  t.equal(samples.filter((s) => s.name === 'gateway_requests_total').length, 6, 'no other request series')

  // The latency histogram by status class too: fast refusals do not hide slow answers.
  const durations = (statusClass: string, suffix = 'count', le?: string) => valueOf(samples, `gateway_request_duration_seconds_${suffix}`, { route: '/api/portfolio/ping', method: 'GET', status_class: statusClass, ...(le === undefined ? {} : { le }) })
  t.equal(durations('2xx'), 3)
  t.equal(durations('4xx'), 1)
  t.equal(durations('5xx'), 3)
  t.equal(durations('2xx', 'bucket', '+Inf'), 3)
  t.equal(durations('5xx', 'bucket', '+Inf'), 3)
  t.equal(durations('2xx', 'bucket', '0.001') !== undefined, true, 'buckets start at 1 ms')
  t.equal(durations('5xx', 'bucket', '10'), 3, 'and reach 10 s')
  t.equal(valueOf(samples, 'gateway_request_duration_seconds_count', { route: '/api/portfolio/update', method: 'POST', status_class: '4xx' }), 3)

  t.equal(valueOf(samples, 'gateway_rejections_total', { reason: 'auth' }), 1)
  t.equal(valueOf(samples, 'gateway_rejections_total', { reason: 'validation' }), 1)
  t.equal(valueOf(samples, 'gateway_rejections_total', { reason: 'body_too_large' }), 1)
  t.equal(valueOf(samples, 'gateway_rejections_total', { reason: 'rate_limit' }), 0, 'present at zero')
  t.equal(valueOf(samples, 'gateway_rejections_total', { reason: 'shed' }), 0)

  // DECISIONS 24: each call is counted under the endpoint (host:port) that answered it.
  const calls = (call: string, outcome: string) => valueOf(samples, 'gateway_engine_calls_total', { call, outcome, endpoint: `127.0.0.1:${stub.port}` })
  t.equal(calls('ping', 'ok'), 3)
  t.equal(calls('ping', 'bad_response'), 2, 'not HTTP, and an error that is not the JSON shape')
  t.equal(calls('ping', 'unavailable'), 1)
  t.equal(calls('update', 'ok'), 1)
  t.equal(calls('update', 'engine_error'), 1)
  t.equal(samples.filter((s) => s.name === 'gateway_engine_calls_total').length, 5, 'no other engine series: 401/400 never reach it')
  t.equal(valueOf(samples, 'gateway_engine_call_duration_seconds_count', { call: 'ping' }), 6)
  t.equal(valueOf(samples, 'gateway_engine_call_duration_seconds_count', { call: 'update' }), 2)

  t.equal(valueOf(samples, 'gateway_requests_in_flight'), 0)
  t.ok((valueOf(samples, 'process_cpu_user_seconds_total') ?? -1) >= 0, 'default process metrics')
  t.ok(samples.some((s) => s.name === 'nodejs_eventloop_lag_p99_seconds'), 'event loop lag')
})

t.test('in flight, pool state and a timeout while the engine hangs', async (t) => {
  const stub = await startStubUpstream(faults.hang)
  t.teardown(stub.close)
  const { url, metricsUrl } = await gatewayWithMetrics(t, stub.url, { UPSTREAM_TIMEOUT_MS: '2000' })
  const pending = ping(url)
  while (stub.stats.started === 0) await new Promise((resolve) => setImmediate(resolve))

  const during = (await scrape(metricsUrl)).samples
  t.equal(valueOf(during, 'gateway_requests_in_flight'), 1)
  t.equal(valueOf(during, 'gateway_engine_pool_connections', { state: 'connected' }), 1)
  t.equal(valueOf(during, 'gateway_engine_pool_connections', { state: 'running' }), 1)
  t.equal(valueOf(during, 'gateway_engine_pool_connections', { state: 'queued' }), 0)

  t.same(await pending, { status: 504, body: '{"error":"portfolio engine timed out"}' })
  const after = (await scrape(metricsUrl)).samples
  t.equal(valueOf(after, 'gateway_requests_in_flight'), 0)
  t.equal(valueOf(after, 'gateway_engine_calls_total', { call: 'ping', outcome: 'timeout', endpoint: `127.0.0.1:${stub.port}` }), 1)
})

t.test('an engine that refuses connections: unavailable; /api/health probes count as health calls', async (t) => {
  const refused = await refusedPort()
  const { url, metricsUrl } = await gatewayWithMetrics(t, `http://127.0.0.1:${refused}`)
  const res = await request(`${url}/api/health`, { headers: bearer() })
  t.equal(res.statusCode, 200)
  await res.body.dump()
  const { samples } = await scrape(metricsUrl)
  t.equal(valueOf(samples, 'gateway_engine_calls_total', { call: 'health', outcome: 'unavailable', endpoint: `127.0.0.1:${refused}` }), 1)
  t.equal(valueOf(samples, 'gateway_requests_total', { route: '/api/health', method: 'GET', status_class: '2xx' }), 1)
})

t.test('the public port has no /metrics; the metrics port has nothing else', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url, metricsUrl } = await gatewayWithMetrics(t, stub.url)
  const pub = await request(`${url}/metrics`)
  t.equal(pub.statusCode, 404)
  t.same(await pub.body.json(), { error: 'no route GET /metrics' })
  t.ok(pub.headers['x-request-id'], 'with a request id like every answer')
  const other = await request(`${metricsUrl}/`)
  t.equal(other.statusCode, 404)
  t.same(await other.body.json(), { error: 'not found: metrics are at GET /metrics' })
})

t.test('each app has its own registry', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const one = await gatewayWithMetrics(t, stub.url)
  const two = await gatewayWithMetrics(t, stub.url)
  await ping(one.url)
  t.equal(valueOf((await scrape(one.metricsUrl)).samples, 'gateway_requests_total', { route: '/api/portfolio/ping', method: 'GET', status_class: '2xx' }), 1)
  t.equal(valueOf((await scrape(two.metricsUrl)).samples, 'gateway_requests_total', { route: '/api/portfolio/ping', method: 'GET', status_class: '2xx' }), undefined)
})

t.test('METRICS_PORT=0: no per-request hooks or engine observer (the request path pays nothing); the features\' counters stay', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { metrics, url } = await build(t, { upstreamUrl: stub.url, env: { METRICS_PORT: '0' } })
  t.same(await ping(url), { status: 200, body: 'pong' })
  t.equal((await ping(url, {})).status, 401)
  const samples = parseExposition((await metrics.scrape()).body)
  t.equal(samples.filter((s) => s.name === 'gateway_requests_total' || s.name === 'gateway_engine_calls_total').length, 0, 'no request or engine series')
  t.equal(valueOf(samples, 'gateway_requests_in_flight'), 0, 'the gauge never moved')
  t.equal(valueOf(samples, 'gateway_rejections_total', { reason: 'auth' }), 0, 'no onError hook')
})

t.test('the API other features plug into: key-set refreshes, idempotency short cuts, rate-limit fail-opens', async (t) => {
  const metrics = new GatewayMetrics({ processMetrics: false })
  metrics.keySetRefreshed(true)
  metrics.keySetRefreshed(true)
  metrics.keySetRefreshed(false)
  metrics.idempotencyShortCut('replay')
  metrics.idempotencyShortCut('conflict')
  metrics.idempotencyShortCut('in_flight')
  metrics.idempotencyShortCut('replay')
  metrics.idempotencyShortCut('store_unavailable')
  metrics.keySetKeyUnavailable()
  metrics.rateLimitFailedOpen()
  metrics.rejected('rate_limit')
  metrics.rejected('shed')
  const server = await startMetricsServer(metrics, { port: 0, host: '127.0.0.1' })
  t.teardown(server.close)
  const { samples } = await scrape(`http://127.0.0.1:${server.port}`)
  t.equal(valueOf(samples, 'gateway_jwks_refreshes_total', { result: 'ok' }), 2)
  t.equal(valueOf(samples, 'gateway_jwks_refreshes_total', { result: 'failed' }), 1)
  t.equal(valueOf(samples, 'gateway_idempotency_total', { outcome: 'replay' }), 2)
  t.equal(valueOf(samples, 'gateway_idempotency_total', { outcome: 'conflict' }), 1)
  t.equal(valueOf(samples, 'gateway_idempotency_total', { outcome: 'in_flight' }), 1)
  t.equal(valueOf(samples, 'gateway_idempotency_total', { outcome: 'store_unavailable' }), 1)
  t.equal(valueOf(samples, 'gateway_jwks_unavailable_total'), 1)
  t.equal(valueOf(samples, 'gateway_rate_limit_fail_open_total'), 1)
  t.equal(valueOf(samples, 'gateway_rejections_total', { reason: 'rate_limit' }), 1)
  t.equal(valueOf(samples, 'gateway_rejections_total', { reason: 'shed' }), 1)
  t.equal(samples.some((s) => s.name.startsWith('process_')), false, 'process metrics can be left out')
  t.equal(samples.some((s) => s.name === 'gateway_engine_pool_connections'), false, 'no pool, no pool gauge')
})

t.test('rejection reasons: a 429 is the rate limit whatever raised it; 404 and 5xx are not rejections', async (t) => {
  const tooMany = Object.assign(new Error('Rate limit exceeded'), { statusCode: 429 })
  t.equal(rejectionReason(toGatewayError(tooMany), tooMany.statusCode), 'rate_limit')
  t.equal(rejectionReason(new GatewayError('UNAUTHORIZED'), undefined), 'auth')
  t.equal(rejectionReason(validationError('name must be at most 30 characters'), undefined), 'validation')
  t.equal(rejectionReason(validationError('image must be at most 10485760 bytes'), undefined), 'body_too_large')
  t.equal(rejectionReason(new GatewayError('ROUTE_NOT_FOUND'), undefined), undefined)
  t.equal(rejectionReason(new GatewayError('UPSTREAM_TIMEOUT'), undefined), undefined)
})
