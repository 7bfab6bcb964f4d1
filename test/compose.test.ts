/**
 * compose(config): the gateway's parts, built once and handed to whoever uses
 * them, and one close() that ends them all. In-process, against a stub engine.
 */
import { spawnSync } from 'node:child_process'
import { join } from 'node:path'
import t from 'tap'
import { request } from 'undici'
import { startStubUpstream } from '../fixtures/stub-upstream.js'
import { compose, engineClientOptions } from '../src/compose.js'
import { loadConfig } from '../src/config.js'
import { bearer, SECRET } from './helpers/app.js'
import { metricOf } from './helpers/prometheus.js'
import { ROOT } from './helpers/processes.js'

const env = { JWT_SECRET: SECRET, SHED_EVENT_LOOP_DELAY_MS: '0' }

t.test('the parts are passed, not decorated: the app carries no metrics, store status or key set', async (t) => {
  const gateway = await compose(loadConfig({ ...env, UPSTREAM_URL: 'http://127.0.0.1:9' }))
  t.teardown(gateway.close)
  for (const name of ['metrics', 'storeStatus', 'keySet']) t.notOk(name in gateway.app, `no app.${name}`)
  t.same(gateway.status.store(), { mode: 'memory', state: 'up' }, 'the store is read from the part itself')
  t.equal(gateway.keySet, undefined, 'a static key has no key set')
})

t.test('what the app counts lands in the metrics compose returns', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const gateway = await compose(loadConfig({ ...env, UPSTREAM_URL: stub.url, RATE_LIMIT_PER_MINUTE: '0' }))
  t.teardown(gateway.close)
  const url = await gateway.app.listen({ port: 0, host: '127.0.0.1' })
  const res = await request(`${url}/api/portfolio/ping`, { headers: bearer('not-a-token') })
  await res.body.dump()
  t.equal(res.statusCode, 401)
  t.equal(await metricOf(gateway.metrics, 'gateway_rejections_total', { reason: 'auth' }), 1)
})

t.test('close() closes the app and the engine pool, and a second close() is the same close', async (t) => {
  const gateway = await compose(loadConfig({ ...env, UPSTREAM_URL: 'http://127.0.0.1:9' }))
  await gateway.app.listen({ port: 0, host: '127.0.0.1' })
  const first = gateway.close()
  const second = gateway.close()
  await Promise.all([first, second])
  await gateway.close()
  t.equal(gateway.app.server.listening, false, 'the app stopped listening')
  const call = gateway.engine.call({ method: 'GET', path: '/health', requestId: 'r', userId: 'u' })
  const err = await call.then(() => undefined, (e: unknown) => e) as { cause?: { code?: string } }
  t.match(err.cause?.code, /^UND_ERR_(CLOSED|DESTROYED)$/, 'the engine pool is closed')
})

t.test('without UPSTREAM_URL the embedded reference engine answers, and closes with the gateway', async (t) => {
  const gateway = await compose(loadConfig(env))
  t.teardown(gateway.close)
  t.match(gateway.embeddedEngineUrl, /^http:\/\/127\.0\.0\.1:\d+$/)
  const health = await request(`${gateway.embeddedEngineUrl!}/health`)
  await health.body.dump()
  t.equal(health.statusCode, 200, 'the engine listens on loopback')
  await gateway.close()
  await t.rejects(request(`${gateway.embeddedEngineUrl!}/health`), { code: 'ECONNREFUSED' }, 'and is gone after close()')
})

t.test('the engine client gets UPSTREAM_* from the config in one place', async (t) => {
  const config = loadConfig({
    ...env,
    UPSTREAM_URL: 'http://engines.test:4000',
    UPSTREAM_TIMEOUT_MS: '7000',
    UPSTREAM_TRY_TIMEOUT_MS: '2000',
    UPSTREAM_MAX_QUEUE: '12',
    UPSTREAM_DNS_REFRESH_MS: '900'
  })
  t.same(engineClientOptions(config, config.upstreamUrls!), {
    url: ['http://engines.test:4000'],
    timeoutMs: 7000,
    tryTimeoutMs: 2000,
    maxQueue: 12,
    resolveIntervalMs: 900
  })
  const withServers = loadConfig({ ...env, UPSTREAM_URL: 'http://engines.test:4000', UPSTREAM_DNS_SERVERS: '10.0.0.10:53' })
  t.match(engineClientOptions(withServers, withServers.upstreamUrls!), { connectWithLookup: true, lookup: Function })
})

t.test('importing main starts nothing: a launcher can import it and call main() when it chooses', async (t) => {
  const main = join(ROOT, 'dist', 'src', 'main.js')
  const script = `const m = await import(${JSON.stringify(main)}); console.log(typeof m.main)`
  const run = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
    env: { PATH: process.env['PATH'] ?? '' }, encoding: 'utf8', timeout: 20_000
  })
  t.equal(run.stderr, '')
  t.equal(run.stdout, 'function\n', 'it exported main and exited, listening on nothing')
  t.equal(run.status, 0)
})
