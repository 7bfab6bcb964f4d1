/**
 * The per-user upload cap's timers end with the app (DECISIONS 23): once
 * app.close() has resolved, the gateway neither renews leases nor retries
 * giving places back, so nothing it holds keeps asking Redis.
 */
import { Redis } from 'ioredis'
import t from 'tap'
import { startStubUpstream } from '../../../fixtures/stub-upstream.js'
import { build } from '../../helpers/app.js'
import { attemptUntil, eventually } from '../../helpers/engine.js'
import { requireRedis, startRedis } from '../../helpers/redis.js'
import { slowCreate } from '../../helpers/slow-upload.js'
import { cuttablePath, opened, untilServing } from '../../helpers/upload-cap.js'

const after = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

if (requireRedis(t)) {
  t.test('after app.close() no give-back of an upload place is tried again', async (t) => {
    const redis = await startRedis(t)
    const path = await cuttablePath(t, redis.port)
    const probe = new Redis(redis.url, { retryStrategy: () => 50 })
    t.teardown(() => probe.disconnect())
    probe.on('error', () => {})
    // Every command the gateway's clients are asked to send for this user's leases, sent or refused.
    const key = 'pgw:up:{gina}'
    let asked = 0
    const send = Redis.prototype.sendCommand
    Redis.prototype.sendCommand = function (this: Redis, command, stream) {
      if (this !== probe && command.args.some((arg) => String(arg) === key)) asked++
      return send.call(this, command, stream)
    }
    t.teardown(() => {
      Redis.prototype.sendCommand = send
    })
    const stub = await startStubUpstream()
    t.teardown(stub.close)
    const { app, url } = await build(t, {
      upstreamUrl: stub.url,
      env: { REDIS_URL: path.url },
      uploadMinRate: { stallMs: 60_000, windowMs: 60_000, bytesPerS: 1, tickMs: 1_000 }
    })
    await untilServing(url)
    const track = opened(t)
    const held = track(slowCreate(url, 'gina', { kind: 'hold' }))
    t.equal(
      await attemptUntil(
        async () => await probe.zcard(key),
        (count) => count === 1,
        10_000
      ),
      1,
      'one lease'
    )

    // Its give-back fails while Redis cannot be reached, so it is retried every 200 ms.
    path.cut()
    held.finish()
    t.equal((await held.answer).status, 200)
    const before = asked
    t.ok(await eventually(() => asked >= before + 3, 10_000), 'the give-back is retried while Redis cannot be reached')
    await app.close()
    const closed = asked
    // Absence takes a wait: five retry periods.
    await after(1_000)
    t.equal(asked, closed, 'nothing asked of Redis for the lease after app.close()')
  })
}
