/**
 * DECISIONS 21: `100 Continue` only when the create will really stream.
 * A client that sends `Expect: 100-continue` and waits reads, as the first
 * bytes of the exchange, the refusal of each check a create passes before its
 * body is read: auth, the rate limit, the per-user upload cap, the
 * Idempotency-Key claim (409, and 503 while the store is down) and an upload
 * connection (503 busy). A valid create is invited, then answered 200.
 */
import t, { type Test } from 'tap'
import { startStubUpstream, type StubUpstream } from '../../../fixtures/stub-upstream.js'
import { build, hs256 } from '../../helpers/app.js'
import { clearOfWindowEdge } from '../../helpers/window.js'
import { CREATE_FIELDS, imagePart, multipartBody, pngOfSize } from '../../helpers/multipart.js'
import { attemptUntil } from '../../helpers/engine.js'
import { requireRedis, startRedis } from '../../helpers/redis.js'
import { slowCreate } from '../../helpers/slow-upload.js'
import { rawSocket, type ClientRequest, type Outcome } from '../../helpers/write-first.js'

const FORM = multipartBody([...CREATE_FIELDS, imagePart(pngOfSize(64 * 1024))])

function create (sub: string, headers: Record<string, string> = {}, token = hs256({ sub })): ClientRequest {
  return {
    path: '/api/portfolio/create',
    headers: { authorization: `Bearer ${token}`, 'content-type': FORM.contentType, ...headers },
    body: FORM.body
  }
}

async function engine (t: Test): Promise<StubUpstream> {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  return stub
}

/** Creates of `sub` that stream to the engine and hold their places until the test ends. */
async function holdStreaming (
  t: Test,
  url: string,
  stub: StubUpstream,
  sub: string,
  count: number,
  headers: Record<string, string> = {}
): Promise<void> {
  const before = stub.stats.started
  for (let i = 0; i < count; i++) {
    const held = slowCreate(url, sub, { kind: 'hold' }, 64 * 1024, headers)
    held.answer.catch(() => {})
    t.teardown(() => held.stop())
  }
  const deadline = Date.now() + 10_000
  while (stub.stats.started < before + count && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
  t.equal(stub.stats.started, before + count, `${count} create(s) of ${sub} streaming`)
}

function refusedWithoutInvitation (t: Test, got: Outcome, status: number, body: unknown): void {
  t.equal(got.continued, false, 'no 100 Continue: the first bytes are the final answer')
  t.equal(got.status, status)
  t.same(got.body === undefined ? got.error : JSON.parse(got.body), body)
}

t.test(
  'each check before the body refuses instead of inviting; a valid create is invited, then gets 200',
  async (t) => {
    const stub = await engine(t)
    const { url } = await build(t, { upstreamUrl: stub.url, env: { UPLOAD_MAX_PER_USER: '2' } })
    await holdStreaming(t, url, stub, 'capped', 2)
    await holdStreaming(t, url, stub, 'keyed', 1, { 'idempotency-key': 'k-held' })
    const [badToken, capped, keyInUse, valid] = await Promise.all([
      rawSocket(url, create('anyone', {}, 'expired.or.bad'), { expectContinue: true }),
      rawSocket(url, create('capped'), { expectContinue: true }),
      rawSocket(url, create('keyed', { 'idempotency-key': 'k-held' }), { expectContinue: true }),
      rawSocket(url, create('valid'), { expectContinue: true })
    ])
    t.test('a bad token: 401', async (t) => refusedWithoutInvitation(t, badToken, 401, { error: 'invalid token' }))
    t.test('the per-user upload cap: 429', async (t) =>
      refusedWithoutInvitation(t, capped, 429, { error: 'at most 2 uploads per user at once' })
    )
    t.test('the Idempotency-Key held by a create in progress: 409', async (t) =>
      refusedWithoutInvitation(t, keyInUse, 409, {
        success: false,
        error: {
          source: 'portfolio-gateway',
          code: 'IDEMPOTENCY_KEY_IN_USE',
          message: 'a request with this Idempotency-Key is still in progress',
          function: 'createPortfolio'
        }
      })
    )
    t.equal(valid.continued, true, 'a valid create is invited')
    t.equal(valid.status, 200)
    t.match(JSON.parse(valid.body ?? '{}'), { portfolio_id: /\S/ })
  }
)

t.test('past the rate limit: 429 instead of 100 Continue', async (t) => {
  const stub = await engine(t)
  const { url } = await build(t, { upstreamUrl: stub.url, env: { RATE_LIMIT_PER_MINUTE: '1' } })
  await clearOfWindowEdge()
  const first = await rawSocket(url, create('limited'), { expectContinue: true })
  t.equal(first.continued, true)
  t.equal(first.status, 200)
  refusedWithoutInvitation(t, await rawSocket(url, create('limited'), { expectContinue: true }), 429, {
    error: 'rate limit exceeded'
  })
})

t.test('no upload connection free: 503 UPLOADS_BUSY instead of 100 Continue, after the wait in turn', async (t) => {
  const stub = await engine(t)
  const { url } = await build(t, { upstreamUrl: stub.url, env: { UPLOAD_MAX_CONNECTIONS: '1' } })
  await holdStreaming(t, url, stub, 'holder', 1)
  refusedWithoutInvitation(t, await rawSocket(url, create('waiting'), { expectContinue: true }), 503, {
    error: 'too many uploads in progress, retry later'
  })
})

t.test('the idempotency store down: 503 instead of 100 Continue', async (t) => {
  if (!requireRedis(t)) return
  const redis = await startRedis(t)
  const stub = await engine(t)
  const { url } = await build(t, { upstreamUrl: stub.url, env: { REDIS_URL: redis.url } })
  // The gateway connects to Redis in the background: until then a keyed request is refused too.
  let n = 0
  const before = await attemptUntil(
    async () => await rawSocket(url, create('stored', { 'idempotency-key': `k-up-${n++}` }), { expectContinue: true }),
    (got) => got.status === 200,
    10_000
  )
  t.equal(before.status, 200, 'with the store up, a keyed create goes through')
  t.equal(before.continued, true, 'and is invited')
  await redis.kill()
  refusedWithoutInvitation(
    t,
    await rawSocket(url, create('stored', { 'idempotency-key': 'k-down' }), { expectContinue: true }),
    503,
    { error: 'idempotency store unavailable, retry later' }
  )
})
