/**
 * The per-user upload cap while Redis cannot be reached (DECISIONS 23),
 * with a real redis-server, an in-process gateway and a stub engine:
 * - the cap fails open to the process's own count, one log line each way,
 *   every create so counted in a metric, and once Redis is back the uploads
 *   still in progress are counted there again;
 * - a place given back while Redis could not be told is given back again as
 *   soon as it can, so the user is not refused until the lease expires.
 */
import { Writable } from 'node:stream'
import { Redis } from 'ioredis'
import t from 'tap'
import { startStubUpstream } from '../../../fixtures/stub-upstream.js'
import { LEASE_MS } from '../../../src/limits/upload-share.js'
import { build } from '../../helpers/app.js'
import { attemptUntil, eventually } from '../../helpers/engine.js'
import { metricOf } from '../../helpers/prometheus.js'
import { requireRedis, startRedis } from '../../helpers/redis.js'
import { slowCreate } from '../../helpers/slow-upload.js'
import { createNow, cuttablePath, opened, TOO_MANY, twoHeld, untilServing } from '../../helpers/upload-cap.js'

if (requireRedis(t)) {
  t.test(
    "Redis unreachable: the cap fails open to this gateway's own count, logged once each way and counted",
    async (t) => {
      const redis = await startRedis(t)
      const probe = new Redis(redis.url, { lazyConnect: true, retryStrategy: () => 50 })
      t.teardown(() => probe.disconnect())
      probe.on('error', () => {})
      const stub = await startStubUpstream()
      t.teardown(stub.close)
      const lines: Array<Record<string, unknown>> = []
      const stream = new Writable({
        write (chunk, _enc, cb) {
          lines.push(
            ...String(chunk)
              .split('\n')
              .filter(Boolean)
              .map((l) => JSON.parse(l) as Record<string, unknown>)
          )
          cb()
        }
      })
      const { metrics, url } = await build(t, {
        upstreamUrl: stub.url,
        env: { REDIS_URL: redis.url },
        logger: { level: 'info', stream },
        uploadMinRate: { stallMs: 60_000, windowMs: 60_000, bytesPerS: 1, tickMs: 1_000 }
      })
      await untilServing(url)
      const failOpen = async (): Promise<number | undefined> =>
        await metricOf(metrics, 'gateway_upload_cap_fail_open_total')
      t.equal(await failOpen(), 0)

      await redis.kill()
      const track = opened(t)
      const started = stub.stats.started
      const held = [
        track(slowCreate(url, 'carol', { kind: 'hold' })),
        track(slowCreate(url, 'carol', { kind: 'hold' }))
      ]
      t.ok(
        await eventually(() => stub.stats.started === started + 2, 10_000),
        'both creates stream to the engine though Redis is down'
      )
      const third = await createNow(url, 'carol')
      t.equal(third.status, 429, "the process's own count still holds the cap")
      t.same(JSON.parse(third.text), TOO_MANY)
      t.equal(await failOpen(), 2, 'each create counted by the process alone is counted')
      const down = lines.filter(
        (l) => l['msg'] === "upload cap: the shared store is unreachable; counting this gateway's uploads only"
      )
      t.equal(down.length, 1, 'one warn line for the change, not one per create')
      t.equal(down[0]?.['level'], 40)

      await redis.restart()
      await probe.connect()
      // Once Redis is back, the renewal puts the leases of the creates still in progress there.
      t.equal(
        await attemptUntil(
          async () => await probe.zcard('pgw:up:{carol}'),
          (count) => count === 2,
          15_000
        ),
        2,
        'the two uploads in progress are counted in Redis again'
      )
      for (const c of held) c.finish()
      for (const c of held) t.equal((await c.answer).status, 200)
      t.equal((await createNow(url, 'carol')).status, 200)
      t.equal(
        lines.filter((l) => l['msg'] === 'upload cap: counted in the shared store again').length,
        1,
        'one line when the shared count is back'
      )
      t.equal(await probe.zcard('pgw:up:{carol}'), 0, 'every place given back')
    }
  )

  t.test(
    'a place given back while Redis cannot be reached is given back again once it can, long before its lease would expire',
    async (t) => {
      const redis = await startRedis(t)
      const path = await cuttablePath(t, redis.port)
      const probe = new Redis(redis.url, { retryStrategy: () => 50 })
      t.teardown(() => probe.disconnect())
      probe.on('error', () => {})
      const stub = await startStubUpstream()
      t.teardown(stub.close)
      const { url } = await build(t, {
        upstreamUrl: stub.url,
        env: { REDIS_URL: path.url },
        uploadMinRate: { stallMs: 60_000, windowMs: 60_000, bytesPerS: 1, tickMs: 1_000 }
      })
      await untilServing(url)
      const held = await twoHeld(t, url, probe, 'dave')

      path.cut()
      for (const c of held) c.finish()
      for (const c of held) t.equal((await c.answer).status, 200, 'the creates complete while Redis cannot be reached')
      t.equal(await probe.zcard('pgw:up:{dave}'), 2, 'their leases are still in Redis')
      path.restore()
      const restoredAt = Date.now()
      t.equal(
        await attemptUntil(
          async () => await probe.zcard('pgw:up:{dave}'),
          (count) => count === 0,
          LEASE_MS
        ),
        0,
        'the leases are given back'
      )
      const ms = Date.now() - restoredAt
      t.ok(ms < LEASE_MS / 2, `once Redis can be reached (${ms} ms after), not when they expire (${LEASE_MS} ms)`)
      t.equal((await createNow(url, 'dave')).status, 200)
    }
  )
}
