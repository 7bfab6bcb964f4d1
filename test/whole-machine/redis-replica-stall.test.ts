/**
 * A stalled replica cannot stall the master's users (DECISIONS 26), with
 * real processes: a redis-server master, a replica (--replicaof) and a
 * gateway process in front of a stub engine. Under 20 concurrent keyed
 * updates (each with its own Idempotency-Key: a claim, a rate-limit count, a
 * completion and a replication acknowledgement), the replica is stopped
 * (SIGSTOP: listed online, acknowledging nothing) for 10 s.
 * - no answer is a 503: claims, completions and counts never queue behind a WAIT;
 * - after the first second, keyed p99 stays under 200 ms: once a WAIT is
 *   missed, answers stop waiting for the replica for a few seconds;
 * - gateway_redis_replication_lag_total counts the misses, and the gateway
 *   asks again only now and then: a handful of WAITs, not one per request.
 */
import { performance } from 'node:perf_hooks'
import t from 'tap'
import { startStubUpstream } from '../../fixtures/stub-upstream.js'
import { hs256, validUpdate } from '../helpers/app.js'
import { attemptUntil } from '../helpers/engine.js'
import { scrape, valueOf } from '../helpers/prometheus.js'
import { commandCounts, requireRedis, startReplicated } from '../helpers/redis.js'
import { startGateway, untilStoring, update } from '../helpers/redis-gateways.js'

// Twenty at a time: claims that queue behind a stalled WAIT still pass the gateway's 300 ms Redis bound and answer
// 503 (with the WAIT moved onto the records' connection and given 1 s, 205 answers of 5,740 were), while a loaded
// runner no longer pushes the commands themselves past it (with 40, one CI run at a load of 11 had 207 answers 503
// from commands that simply ran late).
const WORKERS = 20
const STALL_MS = 10_000

interface Sample {
  startedAt: number
  ms: number
  status: number
  code: string | undefined
}

function p99 (values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.ceil(sorted.length * 0.99) - 1)] ?? NaN
}

if (requireRedis(t)) {
  t.test(
    'a SIGSTOPped replica under 20 concurrent keyed updates: no 503, p99 under 200 ms after the first second, misses counted',
    async (t) => {
      const { primary, replica, probe } = await startReplicated(t)
      const stub = await startStubUpstream()
      t.teardown(stub.close)
      const gw = await startGateway(t, stub.url, { REDIS_URL: primary.url, RATE_LIMIT_PER_MINUTE: '1000000' })
      await untilStoring(gw)
      const waits = async (): Promise<number> => (await commandCounts(probe))['wait'] ?? 0
      const lag = async (reason: string): Promise<number> =>
        valueOf((await scrape(gw.metricsUrl)).samples, 'gateway_redis_replication_lag_total', { reason }) ?? NaN
      // The gateway reads INFO replication every few seconds: once it has seen the replica, records wait for it.
      let n = 0
      await attemptUntil(
        async () => {
          await update(gw.url, validUpdate(), { key: `warm-${n++}` })
          return await waits()
        },
        (w) => w > 0,
        15_000
      )

      const samples: Sample[] = []
      let running = true
      const token = hs256({ sub: 'stall' })
      const worker = async (w: number): Promise<void> => {
        for (let i = 0; running; i++) {
          const startedAt = performance.now()
          const answer = await update(gw.url, validUpdate(), { key: `w${w}-${i}`, token })
          samples.push({
            startedAt,
            ms: performance.now() - startedAt,
            status: answer.status,
            code:
              (answer.json as { error?: { code?: string } } | undefined)?.error?.code ??
              (answer.json as { error?: string } | undefined)?.error
          })
        }
      }
      const loadedAt = performance.now()
      const load = Promise.all(Array.from({ length: WORKERS }, async (_, w) => await worker(w)))
      // A baseline under the same load with the replica acknowledging: the machine's own latency, a loaded runner's
      // included.
      await new Promise((resolve) => setTimeout(resolve, 3_000))

      const missedBefore = await lag('missed')
      const waitsBefore = await waits()
      const stoppedAt = performance.now()
      replica.stop()
      await new Promise((resolve) => setTimeout(resolve, STALL_MS))
      const waitsDuring = (await waits()) - waitsBefore
      const missedDuring = (await lag('missed')) - missedBefore
      const unreplicatedDuring = await lag('unreplicated')
      const resumedAt = performance.now()
      replica.cont()
      running = false
      await load

      const during = samples.filter((s) => s.startedAt >= stoppedAt && s.startedAt + s.ms <= resumedAt)
      const settled = during.filter((s) => s.startedAt >= stoppedAt + 1_000)
      const refused = during.filter((s) => s.status !== 200)
      const firstRefusal =
        refused[0] === undefined
          ? 'none'
          : `${Math.round(refused[0].startedAt + refused[0].ms - stoppedAt)} ms after SIGSTOP`
      const p = p99(settled.map((s) => s.ms))
      const baseline = p99(
        samples.filter((s) => s.startedAt >= loadedAt + 1_000 && s.startedAt + s.ms <= stoppedAt).map((s) => s.ms)
      )
      t.comment(
        `replica stopped ${STALL_MS} ms: ${during.length} keyed updates, ${refused.length} not 200 (${[...new Set(refused.map((s) => `${s.status} ${String(s.code)}`))].join(', ')}; first ${firstRefusal}), p99 after the first second ${p.toFixed(1)} ms (replica running: ${baseline.toFixed(1)} ms), WAITs ${waitsDuring}, missed ${missedDuring}, unreplicated ${unreplicatedDuring}`
      )
      t.ok(during.length > WORKERS * 10, `the load kept going (${during.length} answers)`)
      t.equal(refused.filter((s) => s.status === 503).length, 0, 'no 503')
      t.equal(refused.length, 0, 'every keyed update answered 200')
      // Under 200 ms, or 1.5x the replica-running baseline + 50 ms where that is more (a baseline past 100 ms): on a
      // runner that loaded, one window's p99 swings by half of itself between windows, and what tells the stall apart
      // are the 503s and the WAITs counted here. The bound grows with the baseline without a step: it used to jump
      // from 200 to 275 ms at a baseline of 150 ms, where CI baselines sat (146.2, 149.4, 150.0), and a p99 of
      // 201.6 ms failed against 200 at a baseline printed as 150.0.
      const bound = Math.max(200, baseline * 1.5 + 50)
      t.ok(
        p < bound,
        `keyed p99 after the first second: ${p.toFixed(1)} ms < ${bound.toFixed(0)} ms (replica running: ${baseline.toFixed(1)} ms)`
      )
      t.ok(
        missedDuring >= 1,
        `gateway_redis_replication_lag_total{reason="missed"} counts the misses (${missedDuring})`
      )
      t.ok(unreplicatedDuring > 0, 'answers that did not wait for the replica are counted as unreplicated')
      // One WAIT round at a time, paused a few seconds after each miss: a handful, not one per request.
      t.ok(
        waitsDuring >= 2 && waitsDuring <= 8,
        `the gateway asked again now and then (${waitsDuring} WAITs in ${STALL_MS} ms)`
      )

      // The replica running again: records are acknowledged again within a pause.
      const before = await waits()
      const acked = await attemptUntil(
        async () => {
          const missed = await lag('missed')
          const answer = await update(gw.url, validUpdate(), { key: `after-${n++}` })
          return { status: answer.status, missed: (await lag('missed')) - missed, waits: (await waits()) - before }
        },
        (r) => r.status === 200 && r.missed === 0 && r.waits > 0,
        15_000
      )
      t.same(acked, { status: 200, missed: 0, waits: acked.waits }, 'acknowledged again once the replica runs')
    }
  )
}
