/**
 * EngineClient.queueFull reads undici's private `queued` field of a Pool
 * instead of `pool.stats` (which walks every connection: 6-8% of the CPU when
 * read per request). If undici renames the field, the client falls back to the
 * slow walk silently; this test fails loudly instead.
 */
import t from 'tap'
import { Pool } from 'undici'
import { queuedSymbolOf } from '../../src/engine-client/client.js'
import { faults, startStubUpstream } from '../../fixtures/stub-upstream.js'

t.test("undici's Pool still has the `queued` field the shortcut reads, and it counts what stats.queued counts", async (t) => {
  const stub = await startStubUpstream(faults.hang)
  t.teardown(stub.close)
  const pool = new Pool(stub.url, { connections: 1, headersTimeout: 10_000 })
  t.teardown(() => pool.destroy())
  const symbol = queuedSymbolOf(pool)
  t.ok(symbol !== undefined, 'undici renamed the Pool field `queued`: update queuedSymbolOf in src/engine-client/client.ts')
  const read = (): number => (pool as unknown as Record<symbol, number>)[symbol!]!
  t.equal(read(), 0)
  const calls = [1, 2, 3].map(async () => await pool.request({ method: 'GET', path: '/api/portfolio/ping' }).catch(() => {}))
  // One request on the only socket (hung), two waiting for it.
  while (stub.stats.started === 0) await new Promise((resolve) => setTimeout(resolve, 5))
  t.equal(pool.stats.queued, 2)
  t.equal(read(), 2, 'the field agrees with stats.queued')
  await pool.destroy()
  await Promise.all(calls)
})
