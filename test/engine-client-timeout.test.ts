/**
 * UPSTREAM_TIMEOUT_MS counts from the moment the gateway asks (DECISIONS 8),
 * time spent queued for a pool connection included, and to the millisecond
 * rather than on undici's one-second timer grid.
 */
import t from 'tap'
import { EngineClient } from '../src/engine-client/client.js'
import { GatewayError } from '../src/http/errors.js'
import { faults, startStubUpstream } from '../fixtures/stub-upstream.js'

t.test('queued calls time out with the first, not one timeout per call ahead of them', async (t) => {
  const stub = await startStubUpstream(faults.hang)
  t.teardown(stub.close)
  const engine = new EngineClient({ url: stub.url, timeoutMs: 300, connections: 1, keepAliveTimeoutMs: 100 })
  t.teardown(() => engine.close())
  const started = Date.now()
  const outcomes = await Promise.all([1, 2, 3].map(async () => {
    try {
      await engine.call({ method: 'GET', path: '/api/portfolio/ping', requestId: 'r' })
      return { code: 'none', ms: Date.now() - started }
    } catch (err) {
      return { code: (err as GatewayError).code, ms: Date.now() - started }
    }
  }))
  for (const { code, ms } of outcomes) {
    t.equal(code, 'UPSTREAM_TIMEOUT')
    // Not after the first call's own timeout: the queued ones never reached the engine (below).
    t.ok(ms >= 290 && ms < 5_000, `gave up after ${ms} ms (300 ms asked)`)
  }
  t.equal(stub.stats.started, 1, 'the queued calls never reached the engine')
})
