/**
 * Every metric the recipe's alert rules and dashboard query exists in a live
 * Scrape of the gateway: a real gateway process with the
 * features those metrics come from turned on (two engine endpoints, Redis),
 * one request of each route, then GET /metrics on METRICS_PORT.
 *
 * "Exists" means the scrape declares the family (`# TYPE name ...`), as
 * Prometheus would then have a series for it: a labelled counter that has not
 * counted yet (an ejection, a retry) has no sample until it does, and that is
 * what alerts expect. `up` is Prometheus's own, per target, never scraped.
 */
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { request } from 'undici'
import { bearer, hs256, MINTS, SECRET } from '../helpers/app.js'
import { alertRules, dashboardQueries, metricNames } from '../helpers/deploy.js'
import { multipartBody } from '../helpers/multipart.js'
import { ENGINE_SCRIPT, ensureBuilt, freePort, GATEWAY_SCRIPT, startProcess } from '../helpers/processes.js'
import { parseExposition, scrape } from '../helpers/prometheus.js'
import { requireRedis, startRedis } from '../helpers/redis.js'

// Two engines, Redis and a gateway as real processes before one scrape: 36 s on a busy 2-core machine, too near tap's
// 60 s default.
t.setTimeout(120_000)

/** The family a sample or query name belongs to: a histogram's `_bucket`, `_sum` and `_count` are its own. */
function family (name: string, declared: Set<string>): string {
  const base = name.replace(/_(bucket|sum|count)$/, '')
  return declared.has(name) ? name : base
}

t.test('every metric the rules and the dashboard query is in a live scrape', async (t) => {
  if (!requireRedis(t)) return
  ensureBuilt()
  const redis = await startRedis(t)
  const imageDir = mkdtempSync(join(tmpdir(), 'deploy-metrics-engine-'))
  t.teardown(() => rmSync(imageDir, { recursive: true, force: true }))
  const engines = await Promise.all([0, 1].map(async () => {
    const port = await freePort()
    const metricsPort = await freePort()
    const engine = await startProcess(t, ENGINE_SCRIPT, { ENGINE_PORT: String(port), ENGINE_HOST: '127.0.0.1', ENGINE_IMAGE_DIR: imageDir, ENGINE_METRICS_PORT: String(metricsPort) }, port, /portfolio engine ready/)
    return { ...engine, metricsUrl: `http://127.0.0.1:${metricsPort}` }
  }))
  const port = await freePort()
  const metricsPort = await freePort()
  const gateway = await startProcess(t, GATEWAY_SCRIPT, {
    PORT: String(port),
    HOST: '127.0.0.1',
    METRICS_PORT: String(metricsPort),
    JWT_SECRET: SECRET,
    UPSTREAM_URL: engines.map((e) => e.url).join(','),
    REDIS_URL: redis.url,
    LOG_LEVEL: 'info',
    SHED_EVENT_LOOP_DELAY_MS: '0'
  }, port, /gateway ready/)
  await gateway.waitFor(/redis connected/)

  // One request of each route, so the per-route series the dashboard draws exist.
  const token = bearer(hs256({ sub: 'metrics-user' }))
  const form = multipartBody([{ name: 'name', value: 'Scraped' }, { name: 'type', value: 'PORTFOLIO' }])
  const create = await request(`${gateway.url}/api/portfolio/create`, { method: 'POST', headers: { ...token, 'content-type': form.contentType, 'idempotency-key': 'scrape-1' }, body: form.body })
  const created = await create.body.text()
  // The answer in the message: a refusal on a loaded runner says which (engine, store, limit).
  t.equal(create.statusCode, 200, `create: ${created}`)
  const { portfolio_id: id } = JSON.parse(created) as { portfolio_id: string }
  const calls: Array<[string, string, Record<string, string>, string | undefined, number]> = [
    ['GET', '/ping', {}, undefined, 200],
    ['GET', '/health', {}, undefined, 200],
    ['GET', '/openapi.json', {}, undefined, 200],
    ['GET', '/api/health', token, undefined, 200],
    ['GET', '/api/portfolio/ping', token, undefined, 200],
    // The portfolio lives on the engine that created it; either answer is an answered update.
    ['POST', '/api/portfolio/update', { ...token, 'content-type': 'application/json' }, JSON.stringify({ portfolio_id: id, target_positions: [{ mint: MINTS[0], allocation: 1 }] }), 0],
    ['GET', '/no-such-route', {}, undefined, 404]
  ]
  for (const [method, path, headers, body, status] of calls) {
    const res = await request(`${gateway.url}${path}`, { method: method as 'GET' | 'POST', headers, body: body ?? null })
    const answer = await res.body.text()
    if (status !== 0) t.equal(res.statusCode, status, `${method} ${path}: ${answer.slice(0, 200)}`)
  }

  const { status, text } = await scrape(`http://127.0.0.1:${metricsPort}`)
  t.equal(status, 200)
  // The engines' own panels read the engines' scrape (ENGINE_METRICS_PORT).
  const engineScrapes = await Promise.all(engines.map(async (e) => await scrape(e.metricsUrl)))
  const declared = new Set([text, ...engineScrapes.map((e) => e.text)].flatMap((scraped) => [...scraped.matchAll(/^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) /gm)].map((m) => m[1]!)))
  const routes = new Set(parseExposition(text).filter((s) => s.name === 'gateway_requests_total').map((s) => s.labels['route']))
  for (const route of ['/api/portfolio/create', '/api/portfolio/update', '/api/portfolio/ping', '/api/health', '/ping', '/health']) t.ok(routes.has(route), `gateway_requests_total has route="${route}"`)

  const wanted = new Map<string, string[]>()
  const want = (name: string, where: string): void => { wanted.set(name, [...(wanted.get(name) ?? []), where]) }
  for (const rule of alertRules()) for (const name of metricNames(rule.expr)) want(name, `alert ${rule.alert}`)
  for (const query of dashboardQueries()) for (const name of metricNames(query.expr)) want(name, `panel "${query.title}"`)
  const missing = [...wanted].filter(([name]) => !declared.has(family(name, declared)))
  t.same(missing.map(([name, where]) => `${name} (${[...new Set(where)].join(', ')})`), [], 'every queried metric is declared in the scrape')
  t.ok(wanted.size >= 20, `${wanted.size} metric names queried`)
})
