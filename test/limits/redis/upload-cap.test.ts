/**
 * The per-user upload cap across gateways that share Redis (DECISIONS 23),
 * with real processes: a redis-server, the reference engine and two gateways
 * built from dist/, and undici clients that send their image slowly.
 * - a user's creates in progress are counted in Redis, as leases under the
 *   user's hash tag: 2 on one gateway, a third on the other is 429;
 * - a gateway killed mid-upload stops renewing its leases, and they expire
 *   within their bound (LEASE_MS): then the user uploads again.
 */
import { Redis } from 'ioredis'
import t from 'tap'
import { LEASE_MS } from '../../../src/limits/upload-share.js'
import { attemptUntil } from '../../helpers/engine.js'
import { requireRedis, startRedis } from '../../helpers/redis.js'
import { startEngineProcess, startGateway, untilStoring } from '../../helpers/redis-gateways.js'
import { slowCreate } from '../../helpers/slow-upload.js'
import { createNow, opened, STEADY, TOO_MANY } from '../../helpers/upload-cap.js'

if (requireRedis(t)) {
  t.test(
    "two gateways on one Redis: a user with 2 creates in progress on one gets 429 on the other; a killed gateway's leases expire",
    async (t) => {
      const redis = await startRedis(t)
      const probe = new Redis(redis.url)
      t.teardown(() => probe.disconnect())
      const engine = await startEngineProcess(t)
      const [a, b] = await Promise.all([
        startGateway(t, engine.url, { REDIS_URL: redis.url }),
        startGateway(t, engine.url, { REDIS_URL: redis.url })
      ])
      await Promise.all([untilStoring(a!), untilStoring(b!)])
      const track = opened(t)
      const leases = async (): Promise<number> => await probe.zcard('pgw:up:{alice}')

      track(slowCreate(a!.url, 'alice', STEADY))
      track(slowCreate(a!.url, 'alice', STEADY))
      t.equal(
        await attemptUntil(leases, (n) => n === 2, 15_000),
        2,
        "alice's two creates on gateway A hold two leases under her hash tag"
      )

      const third = await createNow(b!.url, 'alice')
      t.equal(third.status, 429, 'a third create of alice on gateway B is refused')
      t.equal(third.headers['retry-after'], '1')
      t.same(JSON.parse(third.text), TOO_MANY)
      t.equal((await createNow(b!.url, 'bob')).status, 200, "another user's create on gateway B goes through")
      t.equal(await leases(), 2, 'the refused create took no lease')

      // Gateway A dies mid-upload: nobody gives its leases back or renews them.
      const killedAt = Date.now()
      a!.proc.kill('SIGKILL')
      t.equal((await createNow(b!.url, 'alice')).status, 429, 'right after the crash the leases still hold')
      // The clock stops when the create that goes through is sent: how long the engine then takes to store it
      // (seconds on a busy machine) says nothing of when the places were freed.
      let sentAt = 0
      const again = await attemptUntil(
        async () => {
          sentAt = Date.now()
          return await createNow(b!.url, 'alice')
        },
        (r) => r.status === 200,
        LEASE_MS + 5_000
      )
      const freedMs = sentAt - killedAt
      t.equal(again.status, 200, 'once they expire alice uploads again')
      // Renewed at most RENEW_MS before the crash, each expires at most LEASE_MS after it; the create that went
      // through was sent at most one refused create's round trip (and a 50 ms pause) after that.
      t.ok(
        freedMs <= LEASE_MS + 1_500,
        `the places were free within the lease's bound (a create sent ${freedMs} ms after the crash went through; leases last ${LEASE_MS} ms)`
      )
      // Leases still valid by Redis's clock (expired ones are trimmed only when a place is next taken).
      const valid = async (): Promise<number> => {
        const [seconds, micros] = await probe.time()
        return await probe.zcount(
          'pgw:up:{alice}',
          `(${Number(seconds) * 1000 + Math.floor(Number(micros) / 1000)}`,
          '+inf'
        )
      }
      t.equal(
        await attemptUntil(valid, (count) => count === 0, 5_000),
        0,
        'no valid lease left: the create that went through gave its place back'
      )
    }
  )
}
