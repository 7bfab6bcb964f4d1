/**
 * The per-user upload cap across gateways that share Redis (DECISIONS 23 v2),
 * with real processes: a redis-server, the reference engine and two gateways
 * built from dist/, and undici clients that send their image slowly.
 * - a user's creates in progress are counted in Redis, as leases under the
 *   user's hash tag: 2 on one gateway, a third on the other is 429;
 * - a gateway killed mid-upload stops renewing its leases, and they expire
 *   within their bound (LEASE_MS): then the user uploads again;
 * - while Redis is unreachable the cap fails open to the process's own count,
 *   one log line each way, every create so counted in a metric.
 */
import { Writable } from 'node:stream'
import { Redis } from 'ioredis'
import t, { type Test } from 'tap'
import { startStubUpstream } from '../fixtures/stub-upstream.js'
import { LEASE_MS } from '../src/routes/create/upload-share.js'
import { build, hs256, validUpdate } from './helpers/app.js'
import { attemptUntil, eventually } from './helpers/engine.js'
import { metricOf } from './helpers/prometheus.js'
import { requireRedis, startRedis } from './helpers/redis.js'
import { startEngineProcess, startGateway, untilStoring, update } from './helpers/redis-gateways.js'
import { slowCreate, type Answer, type SlowCreate } from './helpers/slow-upload.js'

const TOO_MANY = { error: 'at most 2 uploads per user at once' }

/** Stops every slow create a test opened, so no socket outlives it. */
function opened (t: Test): (c: SlowCreate) => SlowCreate {
  const list: SlowCreate[] = []
  t.teardown(() => { for (const c of list) c.stop() })
  return (c) => { list.push(c); return c }
}

/** A whole small create, sent at once: its answer. */
async function createNow (url: string, sub: string): Promise<Answer> {
  const c = slowCreate(url, sub, { kind: 'hold' }, 8 * 1024)
  c.finish()
  return await c.answer
}

/** A create that streams for minutes at 8 KiB/s: above the minimum rate, so it is never cut off. */
const STEADY = { kind: 'steady', bytesPerS: 8 * 1024, everyMs: 200 } as const

if (requireRedis(t)) {
  t.test('two gateways on one Redis: a user with 2 creates in progress on one gets 429 on the other; a killed gateway\'s leases expire', async (t) => {
    const redis = await startRedis(t)
    const probe = new Redis(redis.url)
    t.teardown(() => probe.disconnect())
    const engine = await startEngineProcess(t)
    const [a, b] = await Promise.all([startGateway(t, engine.url, { REDIS_URL: redis.url }), startGateway(t, engine.url, { REDIS_URL: redis.url })])
    await Promise.all([untilStoring(a!), untilStoring(b!)])
    const track = opened(t)
    const leases = async (): Promise<number> => await probe.zcard('pgw:up:{alice}')

    track(slowCreate(a!.url, 'alice', STEADY))
    track(slowCreate(a!.url, 'alice', STEADY))
    t.equal(await attemptUntil(leases, (n) => n === 2, 15_000), 2, "alice's two creates on gateway A hold two leases under her hash tag")

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
    const again = await attemptUntil(async () => await createNow(b!.url, 'alice'), (r) => r.status === 200, LEASE_MS + 5_000)
    const freedMs = Date.now() - killedAt
    t.equal(again.status, 200, 'once they expire alice uploads again')
    // Renewed at most RENEW_MS before the crash, each expires at most LEASE_MS after it (plus a retry's round trip).
    t.ok(freedMs <= LEASE_MS + 1_500, `the places were free within the lease's bound (${freedMs} ms after the crash, bound ${LEASE_MS} ms)`)
    t.equal(await leases(), 0, 'no lease left: the create that went through gave its place back')
  })

  t.test('Redis unreachable: the cap fails open to this gateway\'s own count, logged once each way and counted', async (t) => {
    const redis = await startRedis(t)
    const probe = new Redis(redis.url, { lazyConnect: true, retryStrategy: () => 50 })
    t.teardown(() => probe.disconnect())
    probe.on('error', () => {})
    const stub = await startStubUpstream()
    t.teardown(stub.close)
    const lines: Array<Record<string, unknown>> = []
    const stream = new Writable({ write (chunk, _enc, cb) { lines.push(...String(chunk).split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>)); cb() } })
    const { app, url } = await build(t, { upstreamUrl: stub.url, env: { REDIS_URL: redis.url }, logger: { level: 'info', stream }, uploadMinRate: { stallMs: 60_000, windowMs: 60_000, bytesPerS: 1, tickMs: 1_000 } })
    let n = 0
    await attemptUntil(async () => await update(url, validUpdate(), { key: `ready-${n++}`, token: hs256({ sub: 'readiness' }) }), (r) => r.status === 200, 15_000)
    const failOpen = async (): Promise<number | undefined> => await metricOf(app.metrics, 'gateway_upload_cap_fail_open_total')
    t.equal(await failOpen(), 0)

    await redis.kill()
    const track = opened(t)
    const held = [track(slowCreate(url, 'carol', { kind: 'hold' })), track(slowCreate(url, 'carol', { kind: 'hold' }))]
    t.ok(await eventually(() => stub.stats.started === 2, 10_000), 'both creates stream to the engine though Redis is down')
    const third = await createNow(url, 'carol')
    t.equal(third.status, 429, "the process's own count still holds the cap")
    t.same(JSON.parse(third.text), TOO_MANY)
    t.equal(await failOpen(), 2, 'each create counted by the process alone is counted')
    const down = lines.filter((l) => l['msg'] === "upload cap: the shared store is unreachable; counting this gateway's uploads only")
    t.equal(down.length, 1, 'one warn line for the change, not one per create')
    t.equal(down[0]?.['level'], 40)

    await redis.restart()
    await probe.connect()
    // Once Redis is back, the renewal puts the leases of the creates still in progress there.
    t.equal(await attemptUntil(async () => await probe.zcard('pgw:up:{carol}'), (count) => count === 2, 15_000), 2, 'the two uploads in progress are counted in Redis again')
    for (const c of held) c.finish()
    for (const c of held) t.equal((await c.answer).status, 200)
    t.equal((await createNow(url, 'carol')).status, 200)
    t.equal(lines.filter((l) => l['msg'] === 'upload cap: counted in the shared store again').length, 1, 'one line when the shared count is back')
    t.equal(await probe.zcard('pgw:up:{carol}'), 0, 'every place given back')
  })
}
