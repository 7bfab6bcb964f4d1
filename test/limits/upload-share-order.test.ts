/**
 * A user's upload count stays exact whatever order a gateway's calls reach
 * the shared store in (DECISIONS 23). In a Redis Cluster while a slot
 * moves, the ZREM that gives an ended upload's place back can be redirected
 * and reach Redis after the same gateway's next ENTER of that user, sent
 * later (test/limits/redis/cluster.test.ts met it under load: 429s the cap did not
 * call for). So the next ENTER carries the ended leases whose ZREM has not
 * been answered, and the script removes them first.
 *
 * The upload share runs here against a store that holds each ZREM until the
 * test lets it through, as the redirection did, and against a real Redis for
 * the script itself.
 */
import { Redis } from 'ioredis'
import t from 'tap'
import type { SharedUploadCount } from '../../src/limits/limits.js'
import { RedisStore } from '../../src/limits/redis-store.js'
import type { UploadLeaseStore } from '../../src/limits/store.js'
import { UploadShare } from '../../src/limits/upload-share.js'
import { redisAvailable, REDIS_MISSING, startRedis, untilStoreAnswers } from '../helpers/redis.js'
import { silent } from '../helpers/silent-log.js'

const TOO_MANY = 'at most 2 uploads per user at once'

/**
 * The leases of each subject, in memory, with the scripts' rules: ENTER
 * removes the ended leases it carries, then takes a place under the cap. Its
 * ZREMs are held until `deliver` (or `fail`) lets them through, the way a
 * redirected ZREM reached Redis after the next ENTER.
 */
function reorderingStore (): {
  store: UploadLeaseStore
  held: (subject: string) => string[]
  pending: () => number
  leaves: (lease: string) => number
  deliver: () => void
  fail: () => void
} {
  const leases = new Map<string, Set<string>>()
  /** Every leaveUpload call, by lease: the retries too. */
  const leaves = new Map<string, number>()
  const of = (subject: string): Set<string> => leases.get(subject) ?? leases.set(subject, new Set()).get(subject)!
  const zrems: Array<{ run: () => void; reject: (err: Error) => void }> = []
  const store: UploadLeaseStore = {
    enterUpload: async (subject, lease, max, _leaseMs, ended = []) => {
      const held = of(subject)
      for (const gone of ended) held.delete(gone)
      if (held.size >= max) return false
      held.add(lease)
      return true
    },
    leaveUpload: async (subject, lease) =>
      await new Promise<void>((resolve, reject) => {
        leaves.set(lease, (leaves.get(lease) ?? 0) + 1)
        zrems.push({
          run: () => {
            of(subject).delete(lease)
            resolve()
          },
          reject
        })
      }),
    renewUploads: async () => []
  }
  return {
    store,
    held: (subject) => [...of(subject)].sort(),
    pending: () => zrems.length,
    leaves: (lease) => leaves.get(lease) ?? 0,
    deliver: () => {
      for (const z of zrems.splice(0)) z.run()
    },
    fail: () => {
      for (const z of zrems.splice(0)) z.reject(new Error('Connection is closed.'))
    }
  }
}

function shareOn (store: UploadLeaseStore): UploadShare {
  const shared: SharedUploadCount = { store, log: silent, metrics: { uploadCapFailedOpen: () => {} } }
  return new UploadShare({ maxPerUser: 2, maxConnections: 32, endpoints: () => 1, shared })
}

/** The lease ids the share has used so far, in order, from the store's own record. */
const ids = (held: string[]): string => held.map((l) => l.split(':')[1]).join(',')

t.test('a ZREM that reaches the store after the next ENTER never refuses that ENTER', async (t) => {
  const s = reorderingStore()
  const share = shareOn(s.store)
  t.teardown(() => share.close())
  const first = await share.enter('ann')
  const second = await share.enter('ann')
  t.equal(ids(s.held('ann')), '1,2', 'two uploads in progress: both places held')

  // The first upload ends: its ZREM is on its way, not there yet.
  first()
  t.equal(s.pending(), 1)
  // The client got its answer and sends its next create at once: the cap (2) allows it.
  const third = await share.enter('ann')
  t.equal(ids(s.held('ann')), '2,3', 'the ended lease went with the next ENTER; the new one took its place')
  s.deliver()
  t.equal(ids(s.held('ann')), '2,3', 'the late ZREM changes nothing')

  // A fourth while two are in progress is still refused: the cap holds.
  await t.rejects(share.enter('ann'), { code: 'TOO_MANY_UPLOADS', message: TOO_MANY })
  second()
  third()
  s.deliver()
  t.same(s.held('ann'), [], 'every place given back')
})

t.test('a ZREM that failed is carried by the next ENTER, and not retried once that ENTER is answered', async (t) => {
  const s = reorderingStore()
  const share = shareOn(s.store)
  t.teardown(() => share.close())
  const first = await share.enter('bob')
  const second = await share.enter('bob')
  first()
  s.fail()
  // Let the failure reach the share (it then keeps the place to give back again).
  await new Promise((resolve) => setImmediate(resolve))
  const third = await share.enter('bob')
  t.equal(ids(s.held('bob')), '2,3', 'the place whose ZREM failed was given back by the ENTER')
  // The first upload's lease: the same process prefix as the two held, numbered 1.
  const firstLease = s.held('bob')[0]!.replace(/:[^:]*$/, ':1')
  const retriedBefore = s.leaves(firstLease)
  t.ok(retriedBefore >= 1, 'its ZREM was sent (and failed)')
  // Retries of an unreturned place run every 200 ms (RETURN_RETRY_MS): over 2.5 periods none may follow the answered
  // ENTER.
  await new Promise((resolve) => setTimeout(resolve, 500))
  t.equal(
    s.leaves(firstLease) - retriedBefore,
    0,
    'no ZREM of the ended lease after the ENTER that carried it was answered'
  )
  second()
  third()
  s.deliver()
  t.same(s.held('bob'), [])
  t.equal(s.pending(), 0, 'nothing left to give back')
})

t.test("another user's ended leases stay out of this user's ENTER", async (t) => {
  const s = reorderingStore()
  const entered: Array<{ subject: string; ended: readonly string[] }> = []
  const store: UploadLeaseStore = {
    ...s.store,
    enterUpload: async (subject, lease, max, leaseMs, ended = []) => {
      entered.push({ subject, ended })
      return await s.store.enterUpload(subject, lease, max, leaseMs, ended)
    }
  }
  const share = shareOn(store)
  t.teardown(() => share.close())
  const cat = await share.enter('cat')
  cat()
  await share.enter('dan')
  t.same(
    entered.map((e) => `${e.subject}:${e.ended.length}`),
    ['cat:0', 'dan:0'],
    "dan's ENTER carries none of cat's leases"
  )
  s.deliver()
})

t.test(
  'the ENTER script removes the ended leases it carries before it counts (real Redis)',
  { skip: redisAvailable() || process.env['CI'] === 'true' ? false : REDIS_MISSING },
  async (t) => {
    const redis = await startRedis(t)
    const store = new RedisStore({ redis: redis.url, log: silent })
    t.teardown(() => store.close())
    const probe = new Redis(redis.url)
    t.teardown(() => probe.disconnect())
    await untilStoreAnswers(store)
    const uploads = store.uploads!
    t.equal(await uploads.enterUpload('eve', 'a', 2, 60_000), true)
    t.equal(await uploads.enterUpload('eve', 'b', 2, 60_000), true)
    t.equal(await uploads.enterUpload('eve', 'c', 2, 60_000), false, 'full')
    t.equal(
      await uploads.enterUpload('eve', 'c', 2, 60_000, ['a']),
      true,
      'a carried: removed first, so c takes its place'
    )
    t.same(await probe.zrange('pgw:up:{eve}', 0, '-1'), ['b', 'c'])
    t.equal(
      await uploads.enterUpload('eve', 'd', 2, 60_000, ['a', 'zz']),
      false,
      'leases already gone change nothing: still full'
    )
    t.same(await probe.zrange('pgw:up:{eve}', 0, '-1'), ['b', 'c'])
    await uploads.leaveUpload('eve', 'b')
    await uploads.leaveUpload('eve', 'c')
    t.equal(await probe.exists('pgw:up:{eve}'), 0, 'the key goes with its last lease')
  }
)
