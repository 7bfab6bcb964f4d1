/**
 * UPSTREAM_TIMEOUT_MS counts from the moment the gateway asks (DECISIONS 8),
 * time spent queued for a pool connection included, and to the millisecond
 * rather than on undici's one-second timer grid.
 */
import t from 'tap'
import { EngineClient } from '../../src/engine-client/client.js'
import { GatewayError } from '../../src/http/errors.js'
import { faults, startStubUpstream } from '../../fixtures/stub-upstream.js'

t.test('a queued call times out at its own deadline, counted from the ask, while the call ahead still holds the connection', async (t) => {
  const stub = await startStubUpstream(faults.hang)
  t.teardown(stub.close)
  const engine = new EngineClient({ url: stub.url, timeoutMs: 300, connections: 1, keepAliveTimeoutMs: 100 })
  t.teardown(() => engine.close())
  const started = Date.now()
  const outcome = async (requestId: string, ahead = false): Promise<{ code: string, ms: number }> => {
    try {
      // The call ahead holds the only connection for 2 s: the queued ones can reach the engine only if their 300 ms ran
      // from when a connection came free. Its clock is undici's alone, so its socket is cut then, not held
      // (a try timed out by the call's own deadline keeps its socket until the engine answers).
      await engine.call({ method: 'GET', path: '/api/portfolio/ping', requestId, ...(ahead ? { responseTimeoutMs: 0, headersTimeoutMs: 2_000 } : {}) })
      return { code: 'none', ms: Date.now() - started }
    } catch (err) {
      return { code: (err as GatewayError).code, ms: Date.now() - started }
    }
  }
  const [first, ...queued] = await Promise.all([outcome('ahead', true), outcome('queued-1'), outcome('queued-2')])
  for (const { code, ms } of queued) {
    t.equal(code, 'UPSTREAM_TIMEOUT')
    t.ok(ms >= 290 && ms < 1_900, `a queued call gave up after ${ms} ms (300 ms asked), before the call ahead ended`)
  }
  t.equal(first!.code, 'UPSTREAM_TIMEOUT')
  t.ok(first!.ms >= 1_990, `the call ahead gave up after ${first!.ms} ms (2,000 ms asked)`)
  // One more call, once the connection is free: a given-up call that was still sent late would take the
  // connection first (the engine hangs), and this one would never reach the engine.
  t.equal((await outcome('next')).code, 'UPSTREAM_TIMEOUT')
  t.same(stub.requests.map((r) => r.headers['x-request-id']), ['ahead', 'next'], 'the queued calls never reached the engine, the next call did')
})
