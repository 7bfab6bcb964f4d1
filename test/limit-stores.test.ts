/**
 * The store contract (src/limits/store.ts), the same for the in-process store
 * and for Redis: fixed windows, atomic claims, records with their TTL.
 */
import { Redis } from 'ioredis'
import t, { type Test } from 'tap'
import { MemoryStore } from '../src/limits/memory-store.js'
import { RedisStore } from '../src/limits/redis-store.js'
import type { LimitStore } from '../src/limits/store.js'
import { commandCounts, redisAvailable, REDIS_MISSING, startRedis } from './helpers/redis.js'

const silent = { info () {}, warn () {}, error () {}, debug () {}, fatal () {}, trace () {}, child () { return silent }, level: 'silent', silent () {} }

/** Wait for `ms` of wall time to pass: a lower bound only, for a TTL to run out. */
const after = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

async function contract (t: Test, store: LimitStore): Promise<void> {
  t.same((await store.hit('u1', 60_000)).count, 1)
  const second = await store.hit('u1', 60_000)
  t.equal(second.count, 2, 'one window per key')
  t.ok(second.resetMs > 0 && second.resetMs <= 60_000, 'ms to the reset')
  t.equal((await store.hit('u2', 60_000)).count, 1, 'keys are separate')

  // Hits at once from two users, interleaved: each user's hits get 1..n, each number once.
  const hits = await Promise.all(Array.from({ length: 50 }, async (_, i) => ({ user: i % 5 < 3 ? 'burst-a' : 'burst-b', count: (await store.hit(i % 5 < 3 ? 'burst-a' : 'burst-b', 60_000)).count })))
  const countsOf = (user: string) => hits.filter((h) => h.user === user).map((h) => h.count).sort((a, b) => a - b)
  t.same(countsOf('burst-a'), Array.from({ length: 30 }, (_, i) => i + 1), 'concurrent hits: exact counts for one user')
  t.same(countsOf('burst-b'), Array.from({ length: 20 }, (_, i) => i + 1), 'and for another')
  t.equal((await store.hit('burst-a', 60_000)).count, 31, 'the next hit goes on from there')

  await store.hit('short', 30)
  await after(60)
  t.equal((await store.hit('short', 30)).count, 1, 'a new window after the reset')

  t.equal(await store.claim('k', 60_000), undefined, 'the first claim wins')
  t.same(await store.claim('k', 60_000), { state: 'pending' }, 'the second sees it in flight')
  const done = { state: 'done' as const, fingerprint: 'f', status: 200, contentType: 'application/json', body: Buffer.from('{}').toString('base64') }
  await store.complete('k', done, 60_000)
  t.same(await store.claim('k', 60_000), done, 'then the stored answer')
  await store.release('k')
  t.equal(await store.claim('k', 60_000), undefined, 'a released key can be claimed again')

  const claims = await Promise.all(Array.from({ length: 10 }, async () => await store.claim('race', 60_000)))
  t.equal(claims.filter((c) => c === undefined).length, 1, 'ten at once: exactly one claim')

  t.equal(await store.claim('brief', 30), undefined)
  await after(60)
  t.equal(await store.claim('brief', 30), undefined, 'a claim whose holder died frees the key after its TTL')
}

t.test('memory store', async (t) => {
  const store = new MemoryStore()
  t.notOk(store.hit('sync', 60_000) instanceof Promise, 'counts synchronously: no promise on the rate limit\'s in-process path')
  await contract(t, store)
  await store.close()
})

t.test('memory store is bounded: the least recently used entry goes', async (t) => {
  const store = new MemoryStore({ maxEntries: 2 })
  await store.claim('a', 60_000)
  await store.claim('b', 60_000)
  await store.claim('c', 60_000)
  t.equal(await store.claim('a', 60_000), undefined, 'a was evicted')
})

t.test('redis store', { skip: redisAvailable() || process.env['CI'] === 'true' ? false : REDIS_MISSING }, async (t) => {
  const redis = await startRedis(t)
  const store = new RedisStore({ url: redis.url, log: silent as never })
  t.teardown(() => store.close())
  // No offline queue: commands fail until the background connect is done.
  for (let i = 0; ; i++) {
    try {
      await store.release('warm-up')
      break
    } catch (err) {
      if (i > 200) throw err
      await after(20)
    }
  }
  await contract(t, store)

  // The hits of one turn of the event loop are one script call: one INCRBY per user, each key given its expiry once.
  const probe = new Redis(redis.url)
  t.teardown(() => probe.disconnect())
  const before = await commandCounts(probe)
  const counts = await Promise.all(Array.from({ length: 40 }, async (_, i) => (await store.hit(i % 2 === 0 ? 'turn-a' : 'turn-b', 60_000)).count))
  const later = await commandCounts(probe)
  const more = (name: string) => (later[name] ?? 0) - (before[name] ?? 0)
  t.equal(more('evalsha') + more('eval'), 1, '40 hits, one script call')
  t.equal(more('incrby'), 2, 'one INCRBY per user')
  t.equal(more('pexpire'), 2, 'a new key gets its expiry')
  t.same(counts.filter((_, i) => i % 2 === 0).sort((a, b) => a - b), Array.from({ length: 20 }, (_, i) => i + 1))
  const [key] = await probe.keys('pgw:rl:turn-a:*')
  const ttl = await probe.pttl(key!)
  t.ok(ttl > 60_000 && ttl <= 65_000, `the window's key outlives it by the slack (pttl ${ttl})`)

  await redis.kill()
  await t.rejects(store.hit('u1', 60_000), 'a command fails at once while Redis is down')
})
