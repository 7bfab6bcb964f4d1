/**
 * Uploads share the engine fairly (DECISIONS 23), over real sockets with
 * undici clients and a stub engine that counts requests begun, completed and
 * broken off:
 * - a per-user cap on creates in progress (429, before any engine request);
 * - a share of the engine connections for uploads, so ping and update always
 *   find one (past it: wait in turn, then 503);
 * - the minimum-rate rule: a stalled or trickling client is cut off with 408
 *   and its engine request aborted (a steady 6 KiB/s phone gets through:
 *   create-steady-phone.test.ts, 33 s on its own).
 */
import t, { type Test } from 'tap'
import { request } from 'undici'
import { startStubUpstream } from '../../../fixtures/stub-upstream.js'
import { bearer, build, hs256, validUpdate } from '../../helpers/app.js'
import { eventually } from '../../helpers/engine.js'
import { slowCreate, type Answer, type SlowCreate } from '../../helpers/slow-upload.js'
import { GatewayError } from '../../../src/http/errors.js'
import { rejectionReason } from '../../../src/observability/request-metrics.js'

// The production minimum rate is measured over 30 s, so the steady 6 KiB/s upload takes about 33 s by design.
t.setTimeout(120_000)

/** Answers as they arrive: the index of each create that has been answered, and its answer. */
function answered (creates: SlowCreate[]): Map<number, Answer> {
  const got = new Map<number, Answer>()
  creates.forEach((c, i) => { c.answer.then((a) => got.set(i, a), () => {}) })
  return got
}

/** Stops every slow create a test opened, so no socket outlives it. */
function opened (t: Test): SlowCreate[] {
  const list: SlowCreate[] = []
  t.teardown(() => { for (const c of list) c.stop() })
  return list
}

/** The minimum-rate rule far away: these tests hold uploads on purpose. */
const PATIENT = { stallMs: 60_000, windowMs: 60_000, bytesPerS: 1, tickMs: 1_000 }

t.test('one user with 40 slow creates: 2 stream, the other 38 get 429 before any engine request', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url, uploadMinRate: PATIENT })
  const creates = opened(t)
  for (let i = 0; i < 40; i++) creates.push(slowCreate(url, 'mallory', { kind: 'hold' }))
  const got = answered(creates)
  t.ok(await eventually(() => stub.stats.started === 2 && got.size === 38, 20_000), 'two creates stream to the engine, 38 are answered')
  // The two held creates wait for their client: nothing answers them meanwhile.
  await new Promise((resolve) => setTimeout(resolve, 200))
  const holding = creates.filter((_, i) => !got.has(i))
  t.equal(holding.length, 2, 'two still uploading')
  for (const answer of got.values()) {
    t.equal(answer.status, 429)
    t.equal(answer.headers['retry-after'], '1')
    t.same(JSON.parse(answer.text), { error: 'at most 2 uploads per user at once' })
  }
  t.equal(stub.stats.started, 2, 'no refused create reached the engine')
  // Another user is not affected by mallory's cap.
  const other = slowCreate(url, 'alice', { kind: 'hold' })
  creates.push(other)
  other.finish()
  t.equal((await other.answer).status, 200, "another user's create goes through")
  for (const c of holding) c.finish()
  for (const c of holding) t.equal((await c.answer).status, 200, 'the two held creates complete')
  // Their places are free again.
  const again = slowCreate(url, 'mallory', { kind: 'hold' })
  creates.push(again)
  again.finish()
  t.equal((await again.answer).status, 200, 'a new create once the first two are done')
})

t.test("40 users' slow creates hold at most their share of the engine pool: another user's ping and update stay fast", async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  // A 16-connection pool with a share of 4 for uploads: without the share, 40 held uploads would take all 16.
  // UPSTREAM_TIMEOUT_MS long enough that the 4 waiting creates are still waiting when the others finish, on a loaded
  // runner.
  const { url, engine } = await build(t, { upstreamUrl: stub.url, uploadMinRate: PATIENT, pool: { connections: 16 }, env: { UPLOAD_MAX_CONNECTIONS: '4', UPSTREAM_TIMEOUT_MS: '30000' } })
  const zoe = bearer(hs256({ sub: 'zoe' }))
  /** Another user's 30 pings and 30 updates, one after another: how long each took, and the calls the pool queued. */
  const zoesCalls = async (): Promise<{ p90: number; slowest: number; queued: number }> => {
    const latencies: number[] = []
    let queued = 0
    for (let i = 0; i < 30; i++) {
      // Order of events, not only the clock: no call of zoe's ever waits for an engine connection.
      queued += engine.poolState().queued
      const begun = performance.now()
      const ping = await request(`${url}/api/portfolio/ping`, { headers: zoe })
      t.equal(await ping.body.text(), 'pong')
      latencies.push(performance.now() - begun)
      const start = performance.now()
      const update = await request(`${url}/api/portfolio/update`, { method: 'POST', headers: { ...zoe, 'content-type': 'application/json' }, body: JSON.stringify(validUpdate()) })
      t.equal(update.statusCode, 200)
      await update.body.dump()
      latencies.push(performance.now() - start)
    }
    latencies.sort((a, b) => a - b)
    return { p90: latencies[Math.ceil(latencies.length * 0.9) - 1]!, slowest: latencies[latencies.length - 1]!, queued }
  }
  // The same 60 calls before any upload: what they take on this machine, at its load now.
  const baseline = await zoesCalls()
  t.equal(stub.stats.started, 60, "zoe's 60 calls reached the engine")
  const creates = opened(t)
  for (let i = 0; i < 40; i++) creates.push(slowCreate(url, `user-${i}`, { kind: 'hold' }))
  t.ok(await eventually(() => stub.stats.started === 60 + 4, 10_000), 'four creates stream to the engine')
  // Four wait their turn (the FIFO holds as many as the share), for up to 30 s; the other 32 are refused at once.
  const got = answered(creates)
  t.ok(await eventually(() => got.size === 32, 15_000), '32 refused: the queue of waiting creates is full')
  await new Promise((resolve) => setTimeout(resolve, 200))
  t.equal(got.size, 32, 'and no more: 4 stream, 4 wait')
  for (const answer of got.values()) {
    t.equal(answer.status, 503)
    t.equal(answer.headers['retry-after'], '1')
    t.same(JSON.parse(answer.text), { error: 'too many uploads in progress, retry later' })
  }
  const early = creates.map((_, i) => got.get(i))
  // Another user, while 4 uploads hold engine connections and 4 wait for one.
  const { p90, slowest, queued } = await zoesCalls()
  t.equal(queued, 0, 'the engine pool never had a call waiting for a connection')
  // The bound is 100 ms, but a loaded 2-core runner alone takes most of it (CI measured a p90 of 83 ms):
  // the bound is 100 ms or three times the p90 of the same calls before the uploads, whichever is more. The exact
  // proof is the queue above; a call queued behind the uploads would wait up to the 30 s UPSTREAM_TIMEOUT_MS.
  const bound = Math.max(100, 3 * baseline.p90)
  t.ok(p90 < bound, `90% of zoe's 60 calls took under ${p90.toFixed(1)} ms (< ${bound.toFixed(1)} ms: ` +
    `100 ms, or 3 times the ${baseline.p90.toFixed(1)} ms before the uploads)`)
  t.ok(slowest < 1_000, `the slowest took ${slowest.toFixed(1)} ms (< 1 s)`)
  t.equal(stub.stats.started, 60 + 4 + 60, 'still only four uploads at the engine')
  // The 4 streaming and the 4 waiting: each waiter gets its turn as a streaming create ends.
  const kept = creates.filter((_, i) => early[i] === undefined)
  for (const c of kept) c.finish()
  const results = await Promise.all(kept.map(async (c) => await c.answer))
  t.same(results.map((r) => r.status), [200, 200, 200, 200, 200, 200, 200, 200], 'the 4 streaming and, in turn, the 4 waiting creates complete')
  t.equal(stub.requests.length, 60 + 60 + 8)
})

t.test('a create waits for an upload connection within UPSTREAM_TIMEOUT_MS, then 503', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url, uploadMinRate: PATIENT, env: { UPLOAD_MAX_CONNECTIONS: '1', UPSTREAM_TIMEOUT_MS: '500' } })
  const creates = opened(t)
  const first = slowCreate(url, 'ann', { kind: 'hold' })
  creates.push(first)
  t.ok(await eventually(() => stub.stats.started === 1, 10_000))
  const second = slowCreate(url, 'bob', { kind: 'hold' })
  creates.push(second)
  const begun = performance.now()
  const answer = await second.answer
  const waited = performance.now() - begun
  t.equal(answer.status, 503)
  t.equal(answer.headers['retry-after'], '1')
  t.same(JSON.parse(answer.text), { error: 'too many uploads in progress, retry later' })
  t.ok(waited >= 450, `it waited its turn (${waited.toFixed(0)} ms)`)
  t.equal(stub.stats.started, 1, 'it never reached the engine')
  first.finish()
  t.equal((await first.answer).status, 200)
})

// 10 s, 30 s and 4 KiB/s shortened, checked every 100 ms; each case far from the other rule, so a
// timer late on a loaded runner cannot make the trickle look like a stall.
const MIN_RATE_CASES = [
  {
    name: 'a stalled upload (no byte for 0.5 s)',
    rule: { stallMs: 500, windowMs: 60_000, bytesPerS: 1, tickMs: 100 },
    pace: { kind: 'hold' as const },
    message: 'upload stalled: no byte for 0.5 s'
  },
  {
    name: 'a trickling upload (about 1 KiB/s, under 4 KiB/s over 3 s)',
    rule: { stallMs: 60_000, windowMs: 3_000, bytesPerS: 4096, tickMs: 100 },
    pace: { kind: 'trickle' as const, bytes: 100, everyMs: 100 },
    message: 'upload too slow: under 4096 bytes/s over 3 s'
  }
]

for (const { name, rule, pace, message } of MIN_RATE_CASES) {
  t.test(`the minimum rate: ${name} is cut off with 408 and its engine request aborted`, async (t) => {
    const stub = await startStubUpstream()
    t.teardown(stub.close)
    const { url } = await build(t, { upstreamUrl: stub.url, uploadMinRate: rule })
    const creates = opened(t)
    const slow = slowCreate(url, 'slowpoke', pace)
    creates.push(slow)
    const answer = await slow.answer
    t.equal(answer.status, 408)
    t.same(JSON.parse(answer.text), { error: message })
    t.equal(answer.headers.connection, 'close')
    t.ok(await eventually(() => stub.stats.aborted === 1), 'the engine request broke off')
    t.equal(stub.stats.started, 1)
    t.equal(stub.requests.length, 0, 'nothing completed at the engine')
  })
}

t.test('each fair-upload refusal has its own reason in gateway_rejections_total', async (t) => {
  t.equal(rejectionReason(new GatewayError('TOO_MANY_UPLOADS'), 429), 'upload_cap', 'not counted as the rate limit')
  t.equal(rejectionReason(new GatewayError('UPLOADS_BUSY'), 503), 'upload_busy')
  t.equal(rejectionReason(new GatewayError('UPLOAD_TIMEOUT'), 408), 'upload_slow')
  t.equal(rejectionReason(new GatewayError('RATE_LIMITED'), 429), 'rate_limit')
})
