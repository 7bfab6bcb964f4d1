/**
 * The per-user upload cap across a Redis stall (decision: uploads share the engine fairly), with a real
 * redis-server, an in-process gateway and a stub engine. While Redis hangs
 * (SIGSTOP) a renewal is sent and never answered; the gateway drops that
 * connection after its socket timeout, but the renewal stays in Redis's
 * receive buffer and runs first when Redis resumes. It must not bring back
 * the leases of uploads that ended meanwhile: the user would be refused with
 * nothing uploading until they expire.
 */
import { Redis } from 'ioredis'
import t from 'tap'
import { startStubUpstream } from '../../../fixtures/stub-upstream.js'
import { LEASE_MS, RENEW_MS } from '../../../src/limits/upload-share.js'
import { build } from '../../helpers/app.js'
import { metricOf } from '../../helpers/prometheus.js'
import { attemptUntil, eventually } from '../../helpers/engine.js'
import { requireRedis, startRedis } from '../../helpers/redis.js'
import { createNow, twoHeld, untilServing } from '../../helpers/upload-cap.js'

const after = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

if (requireRedis(t)) {
  t.test(
    'a renewal that Redis runs late, after a stall, does not bring back the leases of uploads that ended during it',
    async (t) => {
      const redis = await startRedis(t)
      const probe = new Redis(redis.url, { retryStrategy: () => 50 })
      t.teardown(() => probe.disconnect())
      probe.on('error', () => {})
      const stub = await startStubUpstream()
      t.teardown(stub.close)
      const { metrics, url } = await build(t, {
        upstreamUrl: stub.url,
        env: { REDIS_URL: redis.url },
        uploadMinRate: { stallMs: 60_000, windowMs: 60_000, bytesPerS: 1, tickMs: 1_000 }
      })
      const ready = async (): Promise<void> => { await untilServing(url) }
      await ready()
      const held = await twoHeld(t, url, probe, 'erin')

      redis.stop()
      // The stall itself: long enough that a renewal is sent into it and its connection dropped (socket timeout 1 s).
      await after(RENEW_MS + 1_500)
      const aborted = stub.stats.aborted
      for (const c of held) c.stop()
      t.ok(await eventually(() => stub.stats.aborted === aborted + 2, 10_000), 'both uploads ended while Redis hangs')
      // Longer than a lease: a gateway that gave up giving the places back by now would let the late renewal win.
      await after(LEASE_MS + 1_000)
      redis.cont()
      const resumedAt = Date.now()
      await ready()
      // Counted in Redis, not by this process alone: a create the cap let through uncounted would prove nothing.
      const failOpen = async (): Promise<number | undefined> =>
        await metricOf(metrics, 'gateway_upload_cap_fail_open_total')
      const failedOpen = await failOpen()
      const create = await createNow(url, 'erin')
      const ms = Date.now() - resumedAt
      t.equal(create.status, 200, `the user's next create is taken (${ms} ms after Redis resumed)`)
      t.equal(await failOpen(), failedOpen, 'and was counted in Redis')
      // Revived leases would refuse it until they expire, a whole lease after Redis resumed.
      t.ok(ms < LEASE_MS - 1_000, `before the revived leases would expire (${ms} ms, a lease is ${LEASE_MS} ms)`)
      t.equal(
        await attemptUntil(
          async () => await probe.zcard('pgw:up:{erin}'),
          (count) => count === 0,
          5_000
        ),
        0,
        'no lease left in Redis'
      )
    }
  )
}
