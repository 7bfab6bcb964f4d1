/**
 * UPSTREAM_TIMEOUT_MS counts from the moment the gateway asks (DECISIONS 8),
 * time spent queued for a pool connection included, and to the millisecond
 * rather than on undici's one-second timer grid.
 */
import t from 'tap'
import { EngineClient } from '../src/engine-client/client.js'
import { GatewayError } from '../src/http/errors.js'
import { faults, startStubUpstream } from '../fixtures/stub-upstream.js'

t.test('a queued call times out at its own deadline, counted from the ask, while the call ahead still holds the connection', async (t) => {
  const stub = await startStubUpstream(faults.hang)
  t.teardown(stub.close)
  const engine = new EngineClient({ url: stub.url, timeoutMs: 300, connections: 1, keepAliveTimeoutMs: 100 })
  t.teardown(() => engine.close())
  const started = Date.now()
  const outcome = async (ahead: boolean): Promise<{ code: string, ms: number }> => {
    try {
      // The call ahead holds the only connection for 2 s: the queued ones can reach the engine only if their 300 ms ran from when a connection came free.
      await engine.call({ method: 'GET', path: '/api/portfolio/ping', requestId: 'r', ...(ahead ? { responseTimeoutMs: 2_000, headersTimeoutMs: 2_000 } : {}) })
      return { code: 'none', ms: Date.now() - started }
    } catch (err) {
      return { code: (err as GatewayError).code, ms: Date.now() - started }
    }
  }
  const [first, ...queued] = await Promise.all([outcome(true), outcome(false), outcome(false)])
  for (const { code, ms } of queued) {
    t.equal(code, 'UPSTREAM_TIMEOUT')
    t.ok(ms >= 290 && ms < 1_900, `a queued call gave up after ${ms} ms (300 ms asked), before the call ahead ended`)
  }
  t.equal(first!.code, 'UPSTREAM_TIMEOUT')
  t.ok(first!.ms >= 1_990, `the call ahead gave up after ${first!.ms} ms (2,000 ms asked)`)
  t.equal(stub.stats.started, 1, 'the queued calls never reached the engine')
})
