/**
 * Replicas and credentials (DECISIONS 26), with real redis-servers: a primary
 * and one replica started with --replicaof.
 * - a stored idempotency record waits for the replica (WAIT 1 100); with the
 *   replica stopped (SIGSTOP) the missed acknowledgement is logged and counted
 *   and the answer still goes out; a master left alone costs no WAIT;
 * - gateway_redis_up says whether Redis is reachable;
 * - a wrong password's error is logged without the password.
 */
import { performance } from 'node:perf_hooks'
import { Writable } from 'node:stream'
import t from 'tap'
import { request } from 'undici'
import { startStubUpstream } from '../../fixtures/stub-upstream.js'
import { bearer, build, hs256, validUpdate } from '../helpers/app.js'
import { metricOf } from '../helpers/prometheus.js'
import { attemptUntil } from '../helpers/engine.js'
import { commandCounts, requireRedis, startRedis, startReplicated } from '../helpers/redis.js'

function capture (): { stream: Writable; text: () => string; lines: () => Array<Record<string, unknown>> } {
  const chunks: string[] = []
  const stream = new Writable({
    write (chunk, _enc, cb) {
      chunks.push(String(chunk))
      cb()
    }
  })
  const text = (): string => chunks.join('')
  return {
    stream,
    text,
    lines: () =>
      text()
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as Record<string, unknown>)
  }
}

let keys = 0
async function keyed (url: string): Promise<{ status: number; ms: number }> {
  const start = performance.now()
  const res = await request(`${url}/api/portfolio/update`, {
    method: 'POST',
    body: JSON.stringify(validUpdate()),
    headers: { ...bearer(hs256()), 'content-type': 'application/json', 'idempotency-key': `r-${keys++}` }
  })
  await res.body.dump()
  return { status: res.statusCode, ms: performance.now() - start }
}

/** Try until `done`, at most 15 s (the replica check polls every 2 s). */
const eventually = async <T>(attempt: () => Promise<T>, done: (value: T) => boolean): Promise<T> =>
  await attemptUntil(attempt, done, 15_000)

if (requireRedis(t)) {
  t.test(
    'a record waits for the replica; a stopped replica is a logged, counted miss; a lone master costs no WAIT',
    async (t) => {
      const { primary, replica, probe } = await startReplicated(t)

      const stub = await startStubUpstream()
      t.teardown(() => stub.close())
      const log = capture()
      const { metrics, url } = await build(t, {
        upstreamUrl: stub.url,
        env: { REDIS_URL: primary.url },
        logger: { level: 'warn', stream: log.stream }
      })
      const lag = async (reason: string): Promise<number | undefined> =>
        await metricOf(metrics, 'gateway_redis_replication_lag_total', { reason })
      const waits = async (): Promise<number> => (await commandCounts(probe))['wait'] ?? 0

      // Once the replica check has run, each stored record is followed by a WAIT.
      const first = await eventually(
        async () => ({ answer: await keyed(url), waits: await waits() }),
        (r) => r.answer.status === 200 && r.waits > 0
      )
      t.equal(first.answer.status, 200)
      // A starved replica (a loaded 2-core runner) may miss one 100 ms window, and a miss pauses the WAITs
      // for a few seconds (records then go out unwaited): so try until one record is waited for and acknowledged.
      const missedBy = async (
        write: () => Promise<{ status: number }>
      ): Promise<{ status: number; counted: number }> => {
        const from = (await lag('missed')) ?? 0
        const { status } = await write()
        return { status, counted: ((await lag('missed')) ?? 0) - from }
      }
      const waitedFor = async (): Promise<{ status: number; counted: number; waits: number }> => {
        const from = await waits()
        const written = await missedBy(async () => await keyed(url))
        return { ...written, waits: (await waits()) - from }
      }
      const acknowledged = await eventually(waitedFor, (r) => r.status === 200 && r.counted === 0 && r.waits === 1)
      t.equal(acknowledged.waits, 1, 'one WAIT for one stored record')
      t.equal(acknowledged.counted, 0, 'acknowledged: nothing counted')
      t.equal(await metricOf(metrics, 'gateway_redis_up'), 1)

      replica.stop()
      const missedFrom = (await lag('missed')) ?? 0
      const missed = await keyed(url)
      t.equal(missed.status, 200, 'the answer still goes out')
      t.ok(missed.ms >= 100 && missed.ms < 1_000, `after the 100 ms WAIT (${Math.round(missed.ms)} ms)`)
      t.equal(await lag('missed'), missedFrom + 1, 'the missed acknowledgement is counted')
      t.match(
        log
          .lines()
          .filter(
            (l) =>
              l['msg'] ===
              'idempotency record not acknowledged by a replica within 100 ms: a failover now could forget it'
          )
          .at(-1),
        { level: 40, ack: 'missed' },
        'and logged'
      )
      // The miss pauses acknowledgements for a few seconds: records meanwhile go out at once, counted as unreplicated.
      const pausedFrom = { waits: await waits(), unreplicated: (await lag('unreplicated')) ?? 0 }
      const paused = await keyed(url)
      t.equal(paused.status, 200)
      // What proves the pause is the WAIT count below; its latency (no 100 ms wait) is a figure, since a loaded runner
      // stalls any one request.
      t.comment(`answered while paused in ${Math.round(paused.ms)} ms`)
      t.equal(await waits(), pausedFrom.waits, 'no WAIT sent to the stalled replica')
      t.equal(await lag('unreplicated'), pausedFrom.unreplicated + 1, 'counted as unreplicated')
      replica.cont()
      const waitsFrom = await waits()
      const again = await eventually(
        async () => ({ ...(await missedBy(async () => await keyed(url))), waits: (await waits()) - waitsFrom }),
        (r) => r.status === 200 && r.counted === 0 && r.waits > 0
      )
      t.equal(again.counted, 0, 'acknowledged again once the replica runs: the gateway asked again after the pause')
      t.ok(again.waits > 0)

      // The replica gone: once the check has seen it, no WAIT, and the records count as unreplicated.
      await replica.kill()
      await eventually(
        async () => await probe.info('replication'),
        (info) => /^connected_slaves:0/m.test(info)
      )
      const alone = await eventually(
        async () => ({ answer: await keyed(url), unreplicated: await lag('unreplicated') }),
        (r) => (r.unreplicated ?? 0) > 0
      )
      t.equal(alone.answer.status, 200)
      const waitsAlone = await waits()
      const next = await keyed(url)
      t.equal(next.status, 200)
      t.equal(await waits(), waitsAlone, 'a master left alone: no WAIT')
      t.equal(await lag('unreplicated'), (alone.unreplicated ?? 0) + 1, 'counted as unreplicated')

      await primary.kill()
      t.equal(
        await eventually(
          async () => await metricOf(metrics, 'gateway_redis_up'),
          (up) => up === 0
        ),
        0,
        'gateway_redis_up 0 once Redis is gone'
      )
    }
  )

  t.test('a wrong password: logged without the password, keyed requests 503', async (t) => {
    const password = 'right-horse-battery-staple'
    const wrong = 'wrong-horse-battery-staple'
    const redis = await startRedis(t, { args: ['--requirepass', password] })
    const stub = await startStubUpstream()
    t.teardown(() => stub.close())
    const log = capture()
    const { url } = await build(t, {
      upstreamUrl: stub.url,
      env: { REDIS_URL: `redis://:${wrong}@127.0.0.1:${redis.port}` },
      logger: { level: 'info', stream: log.stream }
    })
    await eventually(
      async () => log.text(),
      (text) => text.includes('redis unavailable')
    )
    const down = log
      .lines()
      .find(
        (l) => l['msg'] === 'redis unavailable: rate limits fail open, Idempotency-Key requests get 503; reconnecting'
      )
    t.match(down, { level: 40, reason: /WRONGPASS|invalid password|invalid username-password/ }, 'the line says why')
    t.equal((await keyed(url)).status, 503)
    t.notMatch(log.text(), wrong, 'the password appears in no log line')
    t.notMatch(log.text(), password)

    // With the right one it connects.
    const ok = capture()
    const right = await build(t, {
      upstreamUrl: stub.url,
      env: { REDIS_URL: `redis://:${password}@127.0.0.1:${redis.port}` },
      logger: { level: 'info', stream: ok.stream }
    })
    t.equal(
      (
        await eventually(
          async () => await keyed(right.url),
          (r) => r.status === 200
        )
      ).status,
      200
    )
    t.notMatch(ok.text(), password)
  })
}
