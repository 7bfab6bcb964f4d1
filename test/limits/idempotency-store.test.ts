/**
 * Idempotency under every order of events, with each
 * store (in process, and a real redis-server), over real sockets against the
 * stub engine: a pending claim outlives its request whatever
 * IDEMPOTENCY_TTL_S is, and a replay's content-type is the first answer's,
 * byte for byte, whatever the engine wrote.
 */
import { Redis } from 'ioredis'
import t, { type Test } from 'tap'
import { request } from 'undici'
import { contractHandler, startStubUpstream, type StubHandler, type StubUpstream } from '../../fixtures/stub-upstream.js'
import { bearer, build, hs256, validUpdate } from '../helpers/app.js'
import { redisAvailable, REDIS_MISSING, startRedis } from '../helpers/redis.js'
import { recordKey } from '../../src/limits/redis/keys.js'
import { SERVER_LIMITS } from '../../src/http/limits.js'

async function update (url: string, key: string, token = hs256()) {
  const res = await request(`${url}/api/portfolio/update`, {
    method: 'POST',
    body: JSON.stringify(validUpdate()),
    headers: { ...bearer(token), 'content-type': 'application/json', 'idempotency-key': key }
  })
  const raw = Buffer.from(await res.body.arrayBuffer())
  return { status: res.statusCode, headers: res.headers, raw }
}

/** A Redis-backed gateway accepts keyed requests once its clients are connected (in the background). */
async function connected (url: string): Promise<void> {
  const deadline = Date.now() + 10_000
  for (let i = 0; ; i++) {
    if ((await update(url, `warm-up-${i}`, hs256({ sub: 'warm-up' }))).status !== 503) return
    if (Date.now() > deadline) throw new Error('redis never connected')
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

/** Hold the engine's answer to the next request until `release()`. */
function holdNext (stub: StubUpstream): { arrived: Promise<void>; release: () => void } {
  let release!: () => void
  const held = new Promise<void>((resolve) => {
    release = resolve
  })
  const arrived = new Promise<void>((resolve) => {
    stub.handle(((req, res, body) => {
      resolve()
      void held.then(() => contractHandler(req, res, body))
    }) as StubHandler)
  })
  return { arrived, release }
}

type Store = 'memory' | 'redis'

async function gateway (t: Test, store: Store, stub: StubUpstream, env: Record<string, string> = {}) {
  const redis = store === 'redis' ? await startRedis(t) : undefined
  const built = await build(t, {
    upstreamUrl: stub.url,
    env: { UPSTREAM_TIMEOUT_MS: '5000', ...(redis === undefined ? {} : { REDIS_URL: redis.url }), ...env }
  })
  if (redis !== undefined) await connected(built.url)
  return { ...built, redis }
}

for (const store of ['memory', 'redis'] as const) {
  const skip = store === 'redis' && !redisAvailable() && process.env['CI'] !== 'true' ? REDIS_MISSING : false

  t.test(
    `${store}: a replay's content-type is the first answer's, byte for byte, whatever the engine wrote`,
    { skip },
    async (t) => {
      const stub = await startStubUpstream()
      t.teardown(() => stub.close())
      const { url } = await gateway(t, store, stub)
      const before = stub.requests.length // the warm-up's
      for (const [i, engineType] of [
        'application/json',
        'application/json;charset=UTF-8',
        'application/json; charset=utf-8'
      ].entries()) {
        stub.handle((_req, res) => {
          const text = JSON.stringify({ success: true, message: 'Target positions updated' })
          res.writeHead(200, { 'content-type': engineType, 'content-length': Buffer.byteLength(text) }).end(text)
        })
        const key = `type-${i}`
        const first = await update(url, key)
        t.equal(first.status, 200, engineType)
        const replay = await update(url, key)
        t.equal(replay.headers['idempotent-replayed'], 'true')
        t.equal(
          replay.headers['content-type'],
          first.headers['content-type'],
          `engine sent ${engineType}: the replay says ${String(first.headers['content-type'])} as the first answer did`
        )
        t.same(replay.raw, first.raw)
      }
      t.equal(stub.requests.length - before, 3, 'the replays never reached the engine')
    }
  )

  t.test(`${store}: with IDEMPOTENCY_TTL_S=1 a claim still holds while its request runs`, { skip }, async (t) => {
    const stub = await startStubUpstream()
    t.teardown(() => stub.close())
    const { url, redis } = await gateway(t, store, stub, { IDEMPOTENCY_TTL_S: '1' })
    const before = stub.requests.length // the warm-up's
    const { arrived, release } = holdNext(stub)
    const first = update(url, 'slow')
    await arrived
    if (redis !== undefined) {
      const probe = new Redis(redis.url)
      t.teardown(() => probe.disconnect())
      const ttl = await probe.pttl(recordKey('alice', 'slow'))
      t.ok(
        ttl > SERVER_LIMITS.requestTimeoutMs + 5_000,
        `the pending claim lives past the longest request (pttl ${ttl} ms)`
      )
    }
    // Past the record TTL (1 s), while the engine still works on the first request.
    await new Promise((resolve) => setTimeout(resolve, 1_500))
    const second = await update(url, 'slow')
    t.equal(second.status, 409, 'still in flight: 409, not a second engine call')
    t.equal(stub.requests.length - before, 1)
    release()
    t.equal((await first).status, 200)
    const third = await update(url, 'slow')
    t.equal(third.headers['idempotent-replayed'], 'true', 'then replayed')
    t.equal(stub.requests.length - before, 1, 'one engine call in all')
  })
}
