/**
 * The standalone engine reports on itself: with ENGINE_METRICS_PORT it serves
 * Prometheus metrics on that port (never on the port the gateways call):
 * requests by route template, method and status class with a latency
 * histogram, its store's state and its drain state. Real processes from
 * dist/, real sockets, a real scrape after real traffic.
 */
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { createServer } from 'node:net'
import { readFileSync } from 'node:fs'
import t from 'tap'
import { request } from 'undici'
import { PNG_IMAGE } from '../../fixtures/images.js'
import { EngineEnvError, loadEngineEnv } from '../../src/reference-engine/engine-env.js'
import { MINTS, USER } from '../helpers/engine.js'
import { newImageDir, startEngineProcess } from '../helpers/engine-process.js'
import { CREATE_FIELDS, imagePart, multipartBody } from '../helpers/multipart.js'
import { ENGINE_SCRIPT, ROOT, ensureBuilt, freePort } from '../helpers/processes.js'

t.before(ensureBuilt)

async function scrape (port: number): Promise<{ status: number, type: string, text: string }> {
  const res = await request(`http://127.0.0.1:${port}/metrics`)
  return { status: res.statusCode, type: String(res.headers['content-type']), text: await res.body.text() }
}

/** The value of the one sample line that starts with `series` (name and labels, exactly as exposed). */
function sample (text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(series + ' '))
  return line === undefined ? undefined : Number(line.slice(series.length + 1))
}

t.test('after traffic, a scrape counts each answer by route template, method and status class, with its latency', async (t) => {
  const metricsPort = await freePort()
  const engine = await startEngineProcess(t, { ENGINE_METRICS_PORT: String(metricsPort) })
  const call = async (path: string, init: { method?: 'GET' | 'POST', headers?: Record<string, string>, body?: string | Buffer } = {}) => {
    const res = await request(engine.url + path, { method: init.method ?? 'GET', headers: { 'x-request-id': 'metrics-test', 'x-user-id': USER, ...init.headers }, body: init.body ?? null })
    return { status: res.statusCode, text: await res.body.text() }
  }

  t.equal((await call('/api/portfolio/ping')).status, 200)
  t.equal((await call('/api/portfolio/ping')).status, 200)
  t.equal((await call('/health')).status, 200)
  const { body, contentType } = multipartBody([...CREATE_FIELDS, imagePart(readFileSync(PNG_IMAGE))])
  const created = await call('/api/portfolio/create', { method: 'POST', headers: { 'x-user-id': USER, 'content-type': contentType }, body })
  t.equal(created.status, 200, created.text)
  const missing = await call('/api/portfolio/update', { method: 'POST', headers: { 'x-user-id': USER, 'content-type': 'application/json' }, body: JSON.stringify({ portfolio_id: 'no-such-portfolio', target_positions: [{ mint: MINTS[0], allocation: 1 }] }) })
  t.equal(missing.status, 404, missing.text)
  t.equal((await call('/no/such/route?secret=1')).status, 404)

  const scraped = await scrape(metricsPort)
  t.equal(scraped.status, 200)
  t.match(scraped.type, /^text\/plain; version=0\.0\.4/)
  const text = scraped.text
  t.equal(sample(text, 'portfolio_engine_requests_total{route="/api/portfolio/ping",method="GET",status_class="2xx"}'), 2)
  t.equal(sample(text, 'portfolio_engine_requests_total{route="/health",method="GET",status_class="2xx"}'), 1)
  t.equal(sample(text, 'portfolio_engine_requests_total{route="/api/portfolio/create",method="POST",status_class="2xx"}'), 1)
  t.equal(sample(text, 'portfolio_engine_requests_total{route="/api/portfolio/update",method="POST",status_class="4xx"}'), 1)
  t.equal(sample(text, 'portfolio_engine_requests_total{route="unmatched",method="GET",status_class="4xx"}'), 1)
  t.notMatch(text, /no\/such\/route|secret/, 'no raw URL becomes a label')
  t.equal(sample(text, 'portfolio_engine_request_duration_seconds_count{route="/api/portfolio/ping",method="GET",status_class="2xx"}'), 2)
  t.equal(sample(text, 'portfolio_engine_request_duration_seconds_bucket{le="+Inf",route="/api/portfolio/ping",method="GET",status_class="2xx"}'), 2)
  const pingSeconds = sample(text, 'portfolio_engine_request_duration_seconds_sum{route="/api/portfolio/ping",method="GET",status_class="2xx"}')
  t.ok(pingSeconds !== undefined && pingSeconds > 0 && pingSeconds < 10, `ping latency summed: ${String(pingSeconds)} s`)
  t.equal(sample(text, 'portfolio_engine_store_up{service="database",store="memory"}'), 1)
  t.equal(sample(text, 'portfolio_engine_store_up{service="cache",store="memory"}'), 1)
  t.equal(sample(text, 'portfolio_engine_draining'), 0)
  t.ok(sample(text, 'portfolio_engine_process_resident_memory_bytes') !== undefined, 'process metrics, prefixed')

  // The port the gateways call does not serve them, and the metrics port serves nothing else.
  const onEnginePort = await call('/metrics')
  t.equal(onEnginePort.status, 404)
  const other = await request(`http://127.0.0.1:${metricsPort}/api/portfolio/ping`)
  t.equal(other.statusCode, 404)
  t.same(await other.body.json(), { error: 'not found: the engine serves only GET /metrics here' })
})

t.test('while draining, a scrape says so; the metrics listener outlives the notice', async (t) => {
  const metricsPort = await freePort()
  const engine = await startEngineProcess(t, { ENGINE_METRICS_PORT: String(metricsPort), ENGINE_DRAIN_NOTICE_MS: '60000' })
  t.equal(sample((await scrape(metricsPort)).text, 'portfolio_engine_draining'), 0)
  engine.proc.kill('SIGTERM')
  await engine.waitFor(/draining: \/health answers 500/)
  const scraped = await scrape(metricsPort)
  t.equal(scraped.status, 200)
  t.equal(sample(scraped.text, 'portfolio_engine_draining'), 1)
})

t.test('a store that cannot be reached is 0, by the store kind, never its URL', async (t) => {
  const metricsPort = await freePort()
  // Nothing listens there: the engine starts anyway (it reconnects by itself) and reports the outage.
  const redisPort = await freePort()
  await startEngineProcess(t, { ENGINE_METRICS_PORT: String(metricsPort), ENGINE_REDIS_URL: `redis://:hunter2@127.0.0.1:${redisPort}` })
  const { text } = await scrape(metricsPort)
  t.equal(sample(text, 'portfolio_engine_store_up{service="database",store="redis"}'), 0)
  t.notMatch(text, /hunter2|redis:\/\//)
})

t.test('ENGINE_METRICS_PORT: off by default, validated in one line', async (t) => {
  const base = { ENGINE_IMAGE_DIR: '/tmp/x', ENGINE_PORT: '4000' }
  t.equal(loadEngineEnv(base).metricsPort, undefined)
  t.equal(loadEngineEnv({ ...base, ENGINE_METRICS_PORT: '0' }).metricsPort, undefined)
  t.equal(loadEngineEnv({ ...base, ENGINE_METRICS_PORT: '9465' }).metricsPort, 9465)
  t.throws(() => loadEngineEnv({ ...base, ENGINE_METRICS_PORT: 'nine' }), new EngineEnvError('ENGINE_METRICS_PORT="nine" is invalid: expected an integer port, 0-65535, for GET /metrics on ENGINE_HOST; 0 (the default) serves none'))
  t.throws(() => loadEngineEnv({ ...base, ENGINE_METRICS_PORT: '4000' }), new EngineEnvError('ENGINE_METRICS_PORT=4000 is ENGINE_PORT too: give metrics a port of their own, or 0 for none'))
})

t.test('a busy ENGINE_METRICS_PORT stops start-up with one line that names it', async (t) => {
  const busy = createServer()
  busy.listen(0, '127.0.0.1')
  await once(busy, 'listening')
  t.teardown(() => busy.close())
  const port = (busy.address() as { port: number }).port
  const proc = spawn(process.execPath, [ENGINE_SCRIPT], {
    cwd: ROOT,
    env: { PATH: process.env['PATH'] ?? '', NODE_ENV: 'test', ENGINE_PORT: String(await freePort()), ENGINE_HOST: '127.0.0.1', ENGINE_IMAGE_DIR: newImageDir(t), ENGINE_METRICS_PORT: String(port) },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  let stderr = ''
  proc.stderr.setEncoding('utf8').on('data', (chunk: string) => { stderr += chunk })
  proc.stdout.resume()
  const [code] = await once(proc, 'exit') as [number | null]
  t.equal(code, 1)
  t.equal(stderr, `portfolio-engine: ENGINE_METRICS_PORT=${port} cannot be used on 127.0.0.1: listen EADDRINUSE: address already in use 127.0.0.1:${port}\n`)
})
