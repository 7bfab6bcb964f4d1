/**
 * The store contract (src/limits/store.ts), the same for the in-process store
 * and for Redis: fixed windows, atomic claims, records with their TTL.
 */
import { once } from 'node:events'
import { Redis } from 'ioredis'
import t, { type Test } from 'tap'
import { MemoryStore } from '../../src/limits/memory-store.js'
import { RedisStore } from '../../src/limits/redis-store.js'
import type { LimitStore } from '../../src/limits/store.js'
import { commandCounts, redisAvailable, REDIS_MISSING, startRedis, untilStoreAnswers } from '../helpers/redis.js'
import { clearOfWindowEdge } from '../helpers/window.js'
import { silent } from '../helpers/silent-log.js'

/** Wait for `ms` of wall time to pass: a lower bound only, for a TTL to run out. */
const after = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

async function contract (t: Test, store: LimitStore): Promise<void> {
  // Exact counts within one window.
  await clearOfWindowEdge()
  t.same((await store.hit('u1', 60_000)).count, 1)
  const second = await store.hit('u1', 60_000)
  t.equal(second.count, 2, 'one window per key')
  t.ok(second.resetMs > 0 && second.resetMs <= 60_000, 'ms to the reset')
  t.equal((await store.hit('u2', 60_000)).count, 1, 'keys are separate')

  // Hits at once from two users, interleaved: each user's hits get 1..n, each number once.
  const hits = await Promise.all(
    Array.from({ length: 50 }, async (_, i) => ({
      user: i % 5 < 3 ? 'burst-a' : 'burst-b',
      count: (await store.hit(i % 5 < 3 ? 'burst-a' : 'burst-b', 60_000)).count
    }))
  )
  const countsOf = (user: string) =>
    hits
      .filter((h) => h.user === user)
      .map((h) => h.count)
      .sort((a, b) => a - b)
  t.same(
    countsOf('burst-a'),
    Array.from({ length: 30 }, (_, i) => i + 1),
    'concurrent hits: exact counts for one user'
  )
  t.same(
    countsOf('burst-b'),
    Array.from({ length: 20 }, (_, i) => i + 1),
    'and for another'
  )
  t.equal((await store.hit('burst-a', 60_000)).count, 31, 'the next hit goes on from there')

  await store.hit('short', 30)
  await after(60)
  t.equal((await store.hit('short', 30)).count, 1, 'a new window after the reset')

  t.equal(await store.claim('alice', 'k', 'o1', 60_000), undefined, 'the first claim wins')
  t.same(
    await store.claim('alice', 'k', 'o2', 60_000),
    { state: 'pending' },
    'the second sees it in flight (and not its owner)'
  )
  t.equal(await store.claim('bob', 'k', 'o3', 60_000), undefined, "another subject's key of the same name is separate")
  const done = {
    state: 'done' as const,
    fingerprint: 'f',
    status: 200,
    contentType: 'application/json',
    body: Buffer.from('{}').toString('base64')
  }
  t.equal(
    await store.complete('alice', 'k', 'o2', done, 60_000),
    false,
    'a request that does not hold the claim cannot complete it'
  )
  t.same(await store.claim('alice', 'k', 'o4', 60_000), { state: 'pending' }, 'still pending')
  t.equal(await store.complete('alice', 'k', 'o1', done, 60_000), true, 'the owner completes it')
  t.same(await store.claim('alice', 'k', 'o5', 60_000), done, 'then the stored answer')
  t.equal(await store.release('alice', 'k', 'o1'), false, 'a completed record is no claim: release leaves it')
  t.same(await store.claim('alice', 'k', 'o5', 60_000), done, 'still the stored answer')

  t.equal(await store.claim('alice', 'rel', 'o1', 60_000), undefined)
  t.equal(await store.release('alice', 'rel', 'o2'), false, 'only the owner releases')
  t.equal(await store.release('alice', 'rel', 'o1'), true)
  t.equal(await store.claim('alice', 'rel', 'o3', 60_000), undefined, 'a released key can be claimed again')

  const claims = await Promise.all(
    Array.from({ length: 10 }, async (_, i) => await store.claim('alice', 'race', `r${i}`, 60_000))
  )
  t.equal(claims.filter((c) => c === undefined).length, 1, 'ten at once: exactly one claim')

  t.equal(await store.claim('alice', 'brief', 'o1', 30), undefined)
  await after(60)
  t.equal(
    await store.claim('alice', 'brief', 'o2', 30),
    undefined,
    'a claim whose holder died frees the key after its TTL'
  )

  // The first claim expired mid-request and a newer request claimed
  // the key; the first one's late release or complete leaves the newer one alone.
  t.equal(await store.claim('alice', 'stale', 'first', 30), undefined)
  await after(60)
  t.equal(
    await store.claim('alice', 'stale', 'second', 60_000),
    undefined,
    'the key is claimed again after the first claim expired'
  )
  t.equal(await store.release('alice', 'stale', 'first'), false, 'the stale release deletes nothing')
  t.same(
    await store.claim('alice', 'stale', 'third', 60_000),
    { state: 'pending' },
    'the newer claim holds: a third request gets 409, not the engine'
  )
  const stale = { ...done, fingerprint: 'stale' }
  t.equal(await store.complete('alice', 'stale', 'first', stale, 60_000), false, 'the stale complete writes nothing')
  t.same(await store.claim('alice', 'stale', 'third', 60_000), { state: 'pending' }, 'the newer claim still holds')
  t.equal(await store.complete('alice', 'stale', 'second', done, 60_000), true)
  t.same(await store.claim('alice', 'stale', 'third', 60_000), done, 'and its record is the one kept')
}

t.test('memory store', async (t) => {
  t.equal(
    (new MemoryStore() as LimitStore).uploads,
    undefined,
    'no shared upload count: the upload share counts in the process'
  )
  t.same(new MemoryStore().status(), { mode: 'memory', state: 'up' })
  const store = new MemoryStore()
  t.notOk(
    store.hit('sync', 60_000) instanceof Promise,
    "counts synchronously: no promise on the rate limit's in-process path"
  )
  await contract(t, store)
  await store.close()
})

t.test('memory store is bounded: the least recently used entry goes', async (t) => {
  const store = new MemoryStore({ maxEntries: 2 })
  await store.claim('u', 'a', 'o', 60_000)
  await store.claim('v', 'b', 'o', 60_000)
  await store.claim('w', 'c', 'o', 60_000)
  t.equal(await store.claim('u', 'a', 'o', 60_000), undefined, 'a was evicted')
})

t.test('memory store: one user flooding fresh keys evicts only their own oldest records', async (t) => {
  const store = new MemoryStore({ maxEntries: 1_000, maxRecordsPerSubject: 100 })
  const done = {
    state: 'done' as const,
    fingerprint: 'f',
    status: 200,
    contentType: 'application/json',
    body: Buffer.from('{"portfolio_id":"p-1"}').toString('base64')
  }
  t.equal(await store.claim('alice', 'keep', 'a', 60_000), undefined)
  t.equal(await store.complete('alice', 'keep', 'a', done, 60_000), true)
  // Ten times the whole store, in fresh keys: before the per-subject bound the
  // LRU pushed alice's record out after 1,000 of them.
  for (let i = 0; i < 10_000; i++) await store.claim('mallory', `flood-${i}`, 'm', 60_000)
  t.same(await store.claim('alice', 'keep', 'b', 60_000), done, "alice's record is still there")
  t.same(
    await store.claim('mallory', 'flood-9999', 'x', 60_000),
    { state: 'pending' },
    "mallory's newest claim is kept"
  )
  t.same(await store.claim('mallory', 'flood-9900', 'x', 60_000), { state: 'pending' }, 'so are her last 100')
  t.equal(
    await store.claim('mallory', 'flood-9899', 'x', 60_000),
    undefined,
    'her older ones went (the claim just made took one of her 100 places)'
  )
})
/**
 * Upload leases (DECISIONS 23): at most `max` per subject, taken
 * atomically, given back, renewed, and gone by themselves once unrenewed.
 */
async function leases (t: Test, store: LimitStore, probe: Redis): Promise<void> {
  const uploads = store.uploads!
  const taken = await Promise.all(
    Array.from({ length: 5 }, async (_, i) => await uploads.enterUpload('uploader', `l${i}`, 2, 60_000))
  )
  t.equal(taken.filter(Boolean).length, 2, 'five at once, a cap of 2: exactly two taken')
  t.equal(await uploads.enterUpload('other', 'l0', 2, 60_000), true, "another subject's places are separate")
  t.same(await probe.zcard('pgw:up:{uploader}'), 2, "the leases live in a sorted set under the subject's hash tag")
  const held = taken.flatMap((ok, i) => (ok ? [`l${i}`] : []))
  await uploads.leaveUpload('uploader', held[0]!)
  t.equal(await uploads.enterUpload('uploader', 'l9', 2, 60_000), true, 'a place given back is taken again')
  t.equal(await uploads.enterUpload('uploader', 'l10', 2, 60_000), false, 'then full again')

  // A dead gateway's leases: never renewed, they expire and the places free themselves. A second long: the lease
  // must outlive the two round trips to Redis below on a busy machine (200 ms did not always).
  t.equal(await uploads.enterUpload('crashed', 'a', 1, 1_000), true)
  t.equal(await uploads.enterUpload('crashed', 'b', 1, 1_000), false)
  await uploads.renewUploads([{ subject: 'crashed', lease: 'a' }], 1_000)
  const pttl = await probe.pttl('pgw:up:{crashed}')
  t.ok(pttl > 0 && pttl <= 1_000, `the key expires with its last lease (pttl ${pttl})`)
  await after(1_100)
  t.equal(await uploads.enterUpload('crashed', 'b', 1, 60_000), true, 'an unrenewed lease expires by itself')
  // Renewal never puts back a lease gone (it may run late, after its upload ended): it names it instead.
  const gone = await uploads.renewUploads(
    [
      { subject: 'crashed', lease: 'a' },
      { subject: 'crashed', lease: 'b' },
      { subject: 'other', lease: 'l0' }
    ],
    60_000
  )
  t.same(gone, [{ subject: 'crashed', lease: 'a' }], 'the expired lease is named, the held ones are not')
  t.same(await probe.zrange('pgw:up:{crashed}', 0, '-1'), ['b'], 'and is not put back')
  const pttlRenewed = await probe.pttl('pgw:up:{crashed}')
  t.ok(pttlRenewed > 1_000, `the held lease is extended (pttl ${pttlRenewed})`)
  await uploads.leaveUpload('crashed', 'b')
  t.same(
    await uploads.renewUploads([{ subject: 'crashed', lease: 'b' }], 60_000),
    [{ subject: 'crashed', lease: 'b' }],
    'a renewal that runs after the ZREM does not bring the lease back'
  )
  t.equal(await probe.exists('pgw:up:{crashed}'), 0, 'nor the key')
}

t.test('redis store', { skip: redisAvailable() || process.env['CI'] === 'true' ? false : REDIS_MISSING }, async (t) => {
  const redis = await startRedis(t)
  const store = new RedisStore({ redis: redis.url, log: silent })
  t.teardown(() => store.close())
  await untilStoreAnswers(store)
  await contract(t, store)

  // The hits of one turn of the event loop are one script call: one INCRBY per user, each key given its expiry once.
  const probe = new Redis(redis.url)
  t.teardown(() => probe.disconnect())
  await leases(t, store, probe)
  const before = await commandCounts(probe)
  await clearOfWindowEdge()
  const counts = await Promise.all(
    Array.from({ length: 40 }, async (_, i) => (await store.hit(i % 2 === 0 ? 'turn-a' : 'turn-b', 60_000)).count)
  )
  const later = await commandCounts(probe)
  const more = (name: string) => (later[name] ?? 0) - (before[name] ?? 0)
  t.equal(more('evalsha') + more('eval'), 1, '40 hits, one script call')
  t.equal(more('incrby'), 2, 'one INCRBY per user')
  t.equal(more('pexpire'), 2, 'a new key gets its expiry')
  t.same(
    counts.filter((_, i) => i % 2 === 0).sort((a, b) => a - b),
    Array.from({ length: 20 }, (_, i) => i + 1)
  )
  const [key] = await probe.keys('pgw:rl:{turn-a}:*')
  const ttl = await probe.pttl(key!)
  t.ok(ttl > 60_000 && ttl <= 65_000, `the window's key outlives it by the slack (pttl ${ttl})`)

  await redis.kill()
  await t.rejects(store.hit('u1', 60_000), 'a command fails at once while Redis is down')
})

t.test(
  'redis cluster store (a one-node cluster holding every slot): the same contract, one script call per slot',
  { skip: redisAvailable() || process.env['CI'] === 'true' ? false : REDIS_MISSING },
  async (t) => {
    const { mkdtempSync, rmSync } = await import('node:fs')
    const { tmpdir } = await import('node:os')
    const { join } = await import('node:path')
    const dir = mkdtempSync(join(tmpdir(), 'redis-cluster-store-'))
    t.teardown(() => rmSync(dir, { recursive: true, force: true }))
    // Announced at 127.0.0.1: alone, a node reports its address as '' in CLUSTER SLOTS.
    const redis = await startRedis(t, {
      args: ['--cluster-enabled', 'yes', '--dir', dir, '--cluster-announce-ip', '127.0.0.1']
    })
    const probe = new Redis(redis.url)
    t.teardown(() => probe.disconnect())
    await probe.cluster('ADDSLOTSRANGE', 0, 16383)
    for (let i = 0; !/cluster_state:ok/.test((await probe.cluster('INFO')) as string); i++) {
      if (i > 200) throw new Error('the cluster never became ok')
      await after(20)
    }
    const store = new RedisStore({
      redis: { mode: 'cluster', nodes: [{ host: '127.0.0.1', port: redis.port }] },
      log: silent
    })
    t.teardown(() => store.close())
    t.ok(store.client.isCluster, 'an ioredis Cluster client')
    await untilStoreAnswers(store)
    // The store answering means its records' client is ready; the hits go through the counters' client (store.client).
    if (store.client.status !== 'ready') await once(store.client, 'ready')
    await contract(t, store)
    await leases(t, store, probe)

    const before = await commandCounts(probe)
    const users = ['turn-a', 'turn-b', 'turn-c']
    await clearOfWindowEdge()
    const counts = await Promise.all(
      Array.from({ length: 30 }, async (_, i) => (await store.hit(users[i % 3]!, 60_000)).count)
    )
    const later = await commandCounts(probe)
    const more = (name: string) => (later[name] ?? 0) - (before[name] ?? 0)
    t.equal(more('evalsha') + more('eval'), 3, '30 hits of 3 users in 3 slots: one script call per slot')
    t.equal(more('incrby'), 3)
    t.same(
      counts.filter((_, i) => i % 3 === 0).sort((a, b) => a - b),
      Array.from({ length: 10 }, (_, i) => i + 1),
      'exact counts'
    )
    t.same((await probe.keys('pgw:rl:{turn-a}:*')).length, 1, 'the key carries the hash tag')
  }
)
