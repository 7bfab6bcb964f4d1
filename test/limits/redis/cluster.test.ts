/**
 * Redis Cluster (DECISIONS 26): three primaries made a cluster by
 * `redis-cli --cluster create`, gateway processes on REDIS_CLUSTER_NODES in
 * front of one reference engine. Every key carries its user in a hash tag, so
 * one user's counter and records live in that user's slot; the counter batch
 * of a loop turn is split by slot. A slot moved between nodes during load
 * (IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE: clients meet ASK, then MOVED)
 * loses no count and no record, and refuses no create the upload cap did not
 * call for.
 */
import { once } from 'node:events'
import { readFileSync } from 'node:fs'
import { PassThrough } from 'node:stream'
import type { Cluster } from 'ioredis'
import t from 'tap'
import { request } from 'undici'
import { PNG_IMAGE } from '../../../fixtures/images.js'
import { RedisStore } from '../../../src/limits/redis-store.js'
import { UploadShare } from '../../../src/limits/upload-share.js'
import { bearer, hs256 } from '../../helpers/app.js'
import { multipartBody } from '../../helpers/multipart.js'
import { untilStoreAnswers } from '../../helpers/redis.js'
import {
  type Answer,
  create,
  CREATED,
  type Gateway,
  ping,
  REPEATED,
  startEngineProcess,
  startGateway,
  untilStoring,
  waitUntil,
  within
} from '../../helpers/redis-gateways.js'
import { type ClusterNode, type ClusterSetup, requireTools, startCluster } from '../../helpers/redis-topology.js'
import { silent } from '../../helpers/silent-log.js'

// A three-primary Redis Cluster is built, loaded and failed over: its one test allows 120 s, and the file needs room
// around it.
t.setTimeout(180_000)

const LIMIT = 10
const window = (): number => Math.floor(Date.now() / 60_000)
/** RateLimit's remaining quota (draft-ietf-httpapi-ratelimit-headers), undefined when the limit failed open. */
const remaining = (a: Answer): number | undefined => {
  const match = /^"default";r=(\d+);t=\d+$/.exec(String(a.headers['ratelimit']))
  return match === null ? undefined : Number(match[1])
}

/**
 * Run `attempt` with subjects suffixed `-<n>` until it ran inside one 60 s
 * window (the counters are per clock-aligned window: a burst across the
 * boundary splits in two), at most three times.
 */
async function inOneWindow<T> (attempt: (suffix: string) => Promise<T>): Promise<T> {
  for (let n = 0; ; n++) {
    const before = window()
    const result = await attempt(`-${n}`)
    if (window() === before || n === 2) return result
  }
}

/** Every key of `subject` on `node` (the hash tag as the operator would search for it). */
async function keysOf (node: ClusterNode, subject: string): Promise<string[]> {
  return ((await node.client.call('KEYS', `*{${subject}}*`)) as string[]).sort()
}

/** Where `subject`'s keys live: the node that serves its slot. */
async function homeOf (cluster: ClusterSetup, subject: string): Promise<{ slot: number; node: ClusterNode }> {
  const slot = await cluster.slotOf(subject)
  return { slot, node: await cluster.ownerOf(slot) }
}

if (requireTools(t, ['redis-server', 'redis-cli'], 'Redis Cluster')) {
  // Five gateway processes and three Redis nodes: generous on a loaded runner.
  t.setTimeout(120_000)
  t.test('gateways on a three-primary cluster', async (t) => {
    const cluster = await startCluster(t)
    const engine = await startEngineProcess(t)
    const env = { REDIS_CLUSTER_NODES: cluster.nodeList, RATE_LIMIT_PER_MINUTE: String(LIMIT) }
    const [a, b] = (await Promise.all([startGateway(t, engine.url, env), startGateway(t, engine.url, env)])) as [
      Gateway,
      Gateway
    ]
    await Promise.all([a, b].map((gw) => untilStoring(gw)))

    t.test("one user's limit is exact across two gateways: 25 at once, 10 pass", async (t) => {
      const { subject, answers } = await inOneWindow(async (suffix) => {
        const subject = `limited${suffix}`
        const token = hs256({ sub: subject })
        return {
          subject,
          answers: await Promise.all(Array.from({ length: 25 }, (_, i) => ping(i % 2 === 0 ? a.url : b.url, token)))
        }
      })
      const ok = answers.filter((r) => r.status === 200)
      t.equal(ok.length, LIMIT, 'exactly the limit got 200')
      t.same(
        ok.map(remaining).sort((x, y) => x! - y!),
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
        'each counted once, in one counter'
      )
      const refused = answers.filter((r) => r.status !== 200)
      t.equal(refused.length, 25 - LIMIT)
      t.same([...new Set(refused.map((r) => `${r.status} ${r.text}`))], ['429 {"error":"rate limit exceeded"}'])
      t.ok(
        refused.every((r) => /^\d+$/.test(String(r.headers['retry-after']))),
        'with Retry-After'
      )
      // The counter lives on the node of the user's slot, found by its hash tag.
      const home = await homeOf(cluster, subject)
      const keys = await keysOf(home.node, subject)
      t.equal(keys.length, 1, `one counter on the node of slot ${home.slot}: ${keys.join(' ')}`)
      t.match(keys[0], new RegExp(`\\{${subject}\\}`))
      t.equal(await home.node.client.get(keys[0]!), '25', 'every request counted, the refused ones too')
      for (const other of cluster.nodes.filter((n) => n !== home.node)) { t.same(await keysOf(other, subject), [], 'nothing on the other nodes') }
    })

    t.test('50 users on different slots at once: each counted exactly', async (t) => {
      const result = await inOneWindow(async (suffix) => {
        const subjects = Array.from({ length: 50 }, (_, i) => `batch-${i}${suffix}`)
        // Three requests each, all 150 at once through both gateways: each loop turn's batch spans many slots.
        const sends = subjects.flatMap((subject, i) =>
          [0, 1, 2].map((j) => ({ subject, gw: (i + j) % 2 === 0 ? a : b }))
        )
        const answers = await Promise.all(sends.map(({ subject, gw }) => ping(gw.url, hs256({ sub: subject }))))
        return { subjects, sends, answers }
      })
      const homes = await Promise.all(result.subjects.map((s) => homeOf(cluster, s)))
      t.ok(
        new Set(homes.map((h) => h.slot)).size >= 45,
        `the users span ${new Set(homes.map((h) => h.slot)).size} slots`
      )
      t.equal(new Set(homes.map((h) => h.node)).size, 3, 'on all three nodes')
      t.same(
        result.answers.filter((r) => r.status !== 200).map((r) => r.status),
        [],
        'all 200'
      )
      const seen = new Map<string, number[]>()
      result.sends.forEach(({ subject }, i) =>
        seen.set(subject, [...(seen.get(subject) ?? []), remaining(result.answers[i]!) ?? -1])
      )
      const wrong = [...seen].filter(
        ([, r]) => JSON.stringify([...r].sort((x, y) => x - y)) !== JSON.stringify([LIMIT - 3, LIMIT - 2, LIMIT - 1])
      )
      t.same(wrong, [], 'each user saw 9, 8 and 7 remaining, once each')
      const counters = await Promise.all(
        result.subjects.map(async (s, i) => {
          const keys = await keysOf(homes[i]!.node, s)
          return keys.length === 1 ? await homes[i]!.node.client.get(keys[0]!) : `${keys.length} keys`
        })
      )
      t.same(counters, Array(50).fill('3'), 'each counter in Redis, on its own node, is 3')
    })

    t.test('idempotency for users on each node: in flight 409, replay, reuse 422', async (t) => {
      // A user whose slot is on each of the three nodes.
      const users: Array<{ subject: string; node: ClusterNode }> = []
      for (let i = 0; users.length < 3; i++) {
        const home = await homeOf(cluster, `idem-${i}`)
        if (!users.some((u) => u.node === home.node)) users.push({ subject: `idem-${i}`, node: home.node })
      }
      for (const { subject, node } of users) {
        const token = hs256({ sub: subject })
        // A create whose body is held after its first bytes: the gateway has
        // claimed the key (DECISIONS 16) and waits for the rest. Its length is
        // declared, as browsers and mobile HTTP stacks do for a file. (Sent
        // chunked, the bytes that arrive during the claim are lost today:
        // src/routes/create/route.ts limitBody sets the request flowing before
        // the form parser is attached; reported to the lead, not this issue's.)
        const form = multipartBody([
          { name: 'name', value: 'Alpha' },
          { name: 'type', value: 'PORTFOLIO' },
          { name: 'image', filename: 'a.png', contentType: 'image/png', data: readFileSync(PNG_IMAGE) }
        ])
        const body = new PassThrough()
        const first = request(`${a.url}/api/portfolio/create`, {
          method: 'POST',
          body,
          headers: {
            ...bearer(token),
            'content-type': form.contentType,
            'content-length': String(form.body.length),
            'idempotency-key': 'k1'
          }
        })
        body.write(form.body.subarray(0, 40))
        await waitUntilAsync(async () =>
          (await keysOf(node, subject)).some((k) => k.includes('idem') && k.endsWith(':k1'))
        )
        const inFlight = await create(b.url, 'k1', token)
        t.equal(inFlight.status, 409, `${subject} (node ${node.port}): the same key in flight`)
        t.equal((inFlight.json as { error?: { code?: string } }).error?.code, 'IDEMPOTENCY_KEY_IN_USE')
        body.end(form.body.subarray(40))
        const res = await first
        const stored = { status: res.statusCode, text: await res.body.text() }
        t.equal(stored.status, 200, stored.text)
        const replay = await create(b.url, 'k1', token)
        t.equal(replay.status, 200)
        t.equal(replay.headers['idempotent-replayed'], 'true', 'replayed on the other gateway')
        t.equal(replay.text, stored.text, 'byte for byte')
        const reuse = await create(a.url, 'k1', token, 'Beta')
        t.equal(reuse.status, 422)
        t.equal((reuse.json as { error?: { code?: string } }).error?.code, 'IDEMPOTENCY_KEY_REUSED')
        t.ok(
          (await keysOf(node, subject)).some((k) => k.endsWith(':k1')),
          "the record is on the node of the user's slot"
        )
      }
      await engine.waitFor(CREATED, 3)
      t.equal(engine.count(REPEATED), 0, 'no key reached the engine twice')
    })

    t.test("uploads that end as their slot moves: the user's next creates are not refused", async (t) => {
      const store = new RedisStore({
        redis: { mode: 'cluster', nodes: cluster.nodes.map((n) => ({ host: '127.0.0.1', port: n.port })) },
        log: silent
      })
      t.teardown(() => store.close())
      await untilStoreAnswers(store)
      await countersReady(store)
      const share = new UploadShare({
        maxPerUser: 2,
        maxConnections: 32,
        endpoints: () => 1,
        shared: { store: store.uploads!, log: silent, metrics: { uploadCapFailedOpen: () => {} } }
      })
      t.teardown(() => share.close())
      const subject = `ender-${Date.now()}`
      const key = `pgw:up:{${subject}}`
      const { slot, node: from } = await homeOf(cluster, subject)
      const to = cluster.nodes.find((n) => n !== from)!
      const ended = [await share.enter(subject), await share.enter(subject)]
      t.equal(await from.client.zcard(key), 2, 'two uploads in progress, counted on the node of the slot')
      let next: Array<PromiseSettledResult<() => void>> | undefined
      await cluster.moveSlot(slot, to, async () => {
        // Asked of the old node without naming the key (a key it no longer holds would be answered with ASK).
        if (
          next !== undefined ||
          ((await from.client.call('CLUSTER', 'GETKEYSINSLOT', slot, 1_000)) as string[]).includes(key)
        ) { return }
        // The leases' key has just moved: every call for it now meets ASK. Both
        // uploads end, and their users' next creates come right after.
        for (const leave of ended) leave()
        const node = (store.client as Cluster).nodes('master').find((n) => n.options.port === to.port)!
        if (node.status !== 'ready') await within(once(node, 'ready'), 10_000, 'the connection to the new node')
        next = await Promise.allSettled([share.enter(subject), share.enter(subject)])
      })
      t.same(
        next?.map((r) => (r.status === 'fulfilled' ? 'taken' : String((r.reason as Error).message))),
        ['taken', 'taken'],
        'both places the ended uploads gave back are taken again'
      )
      for (const r of next ?? []) if (r.status === 'fulfilled') r.value()
      await waitUntilAsync(async () => (await to.client.exists(key)) === 0)
      t.pass('every place given back on the new node')
    })

    t.test('a lease call that timed out is not sent again when its ASK arrives late', async (t) => {
      const store = new RedisStore({
        redis: { mode: 'cluster', nodes: cluster.nodes.map((n) => ({ host: '127.0.0.1', port: n.port })) },
        log: silent
      })
      t.teardown(() => store.close())
      await untilStoreAnswers(store)
      await countersReady(store)
      const subject = `late-${Date.now()}`
      const key = `pgw:up:{${subject}}`
      const { slot, node: from } = await homeOf(cluster, subject)
      const to = cluster.nodes.find((n) => n !== from)!
      // The slot starts to move; the user has no key yet, so the old node answers every call for it with ASK.
      await to.client.call('CLUSTER', 'SETSLOT', slot, 'IMPORTING', from.id)
      await from.client.call('CLUSTER', 'SETSLOT', slot, 'MIGRATING', to.id)
      const onTo = async (): Promise<string[]> =>
        (await to.client.pipeline().call('ASKING').zrange(key, 0, '-1').exec())![1]![1] as string[]
      t.teardown(async () => {
        await to.client.pipeline().call('ASKING').del(key).exec()
        for (const node of [from, to]) await node.client.call('CLUSTER', 'SETSLOT', slot, 'STABLE')
      })
      // The old node hangs past commandTimeout (300 ms), not past socketTimeout (1 s): the gateway gives up on the
      // ENTER, and the node's ASK for it arrives once it goes on.
      from.proc.kill('SIGSTOP')
      let err: Error | undefined
      try {
        await store.uploads!.enterUpload(subject, 'given-up', 2, 60_000)
      } catch (e) {
        err = e as Error
      } finally {
        from.proc.kill('SIGCONT')
      }
      t.equal(err?.message, 'Command timed out', 'the caller was told the ENTER failed (and counted the upload itself)')
      // A later call of the same user takes the same path (the old node, ASK, the new node), behind the ASK of the
      // first.
      t.equal(await store.uploads!.enterUpload(subject, 'next', 2, 60_000), true)
      t.same(
        await onTo(),
        ['next'],
        'only the call that was answered ran: the one given up on was not sent on after its ASK'
      )
    })

    t.test('a slot moved during load (ASK, then MOVED) loses no count and no record', async (t) => {
      // Gateways whose limit is never reached: every request is counted, none refused.
      const high = { REDIS_CLUSTER_NODES: cluster.nodeList, RATE_LIMIT_PER_MINUTE: '100000' }
      const gws = await Promise.all([startGateway(t, engine.url, high), startGateway(t, engine.url, high)])
      await Promise.all(gws.map((gw) => untilStoring(gw)))
      const subject = `mover-${Date.now()}`
      const token = hs256({ sub: subject })
      const { slot, node: from } = await homeOf(cluster, subject)
      const to = cluster.nodes.find((n) => n !== from)!

      const answers: Array<{ kind: 'ping' | 'create'; key?: string; answer: Answer }> = []
      let stop = false
      let serial = 0
      const worker = async (gw: Gateway): Promise<void> => {
        for (let i = 0; i < 1_000 && !stop; i++) {
          answers.push({ kind: 'ping', answer: await ping(gw.url, token) })
          const key = `mv-${serial++}`
          answers.push({ kind: 'create', key, answer: await create(gw.url, key, token) })
          await new Promise((resolve) => setTimeout(resolve, 10))
        }
      }
      const hardStop = setTimeout(() => {
        stop = true
      }, 40_000)
      const workers = gws.map(worker)
      const progress = async (n: number): Promise<void> => {
        const target = answers.length + n
        await waitUntil(`${n} more answers`, () => answers.length >= target)
      }
      await progress(20)
      const redirectsBefore = await redirects(from)
      const moved = await cluster.moveSlot(slot, to, () => progress(4))
      await progress(20)
      stop = true
      clearTimeout(hardStop)
      await Promise.all(workers)
      t.equal((await cluster.ownerOf(slot)).port, to.port, `slot ${slot} now on the other node`)
      const redirectsAfter = await redirects(from)
      t.ok(
        redirectsAfter.ask > redirectsBefore.ask,
        `the old node sent the gateways ASK while the slot moved (${redirectsAfter.ask - redirectsBefore.ask} times)`
      )
      t.ok(
        redirectsAfter.moved > redirectsBefore.moved,
        `and MOVED once it had (${redirectsAfter.moved - redirectsBefore.moved} times)`
      )
      t.ok(moved.keysMoved >= 10, `${moved.keysMoved} keys moved one by one under load`)

      t.same(
        answers.filter((x) => x.answer.status !== 200).map((x) => `${x.kind} ${x.answer.status} ${x.answer.text}`),
        [],
        `all ${answers.length} answers 200`
      )
      t.same(
        answers.filter((x) => remaining(x.answer) === undefined).map((x) => x.kind),
        [],
        'none failed open: each counted'
      )
      // Every count is in Redis, on the new node, none lost and none twice.
      const counters = await keysOf(to, subject).then((keys) => keys.filter((k) => k.includes(':rl:')))
      const counted = (await Promise.all(counters.map((k) => to.client.get(k)))).reduce((sum, v) => sum + Number(v), 0)
      t.equal(counted, answers.length, 'the counters hold every request exactly once')
      t.same(await keysOf(from, subject), [], 'nothing left on the old node')
      // Every record answers from the new node: each create replayed.
      const creates = answers.filter((x) => x.kind === 'create')
      const wrong: string[] = []
      for (const c of creates) {
        const replay = await create(gws[0]!.url, c.key!, token)
        if (replay.status !== 200 || replay.headers['idempotent-replayed'] !== 'true' || replay.text !== c.answer.text) { wrong.push(`${c.key!}: ${replay.status} ${replay.text}`) }
      }
      t.same(wrong, [], `all ${creates.length} records replayed after the move`)
      t.equal(engine.count(REPEATED), 0, 'no key reached the engine twice')
    })
  })
}

/** The redirections a node has answered, from Redis's own INFO errorstats. */
async function redirects (node: ClusterNode): Promise<{ ask: number; moved: number }> {
  const stats = await node.client.info('errorstats')
  const count = (name: string): number =>
    Number(new RegExp(`^errorstat_${name}:count=(\\d+)`, 'm').exec(stats)?.[1] ?? 0)
  return { ask: count('ASK'), moved: count('MOVED') }
}

/** The store's counters' client has its slot map (untilStoreAnswers waits for the records' client only). */
async function countersReady (store: RedisStore): Promise<void> {
  if (store.client.status !== 'ready') await within(once(store.client, 'ready'), 10_000, "the counters' client")
}

/** Wait until an async check (a read of Redis) holds. */
async function waitUntilAsync (check: () => Promise<boolean>, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`not within ${ms} ms`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}
