/**
 * Tokens from a JSON Web Key Set (DECISIONS 13) against a local key server
 * (fixtures/key-server.ts) over real sockets: keys and algorithms, the cache,
 * the cooldown, outages, bounds, clock tolerance.
 */
import { createPublicKey, type JsonWebKey } from 'node:crypto'
import t from 'tap'
import { request } from 'undici'
import { bearer, build, hs256, type BuildOptions, type Built } from '../helpers/app.js'
import { metricOf } from '../helpers/prometheus.js'
import { startKeyServer, type KeyServer } from '../../fixtures/key-server.js'
import { startStubUpstream } from '../../fixtures/stub-upstream.js'
import { maxAgeMs } from '../../src/auth/key-set.js'
import { TokenCache } from '../../src/auth/token-cache.js'

// 18 key-set scenarios, several waiting out a fetch timeout or a cooldown: this file reached tap's 60 s default on a
// busy 2-core machine.
t.setTimeout(120_000)

const ISS = 'https://id.example/'
const AUD = 'portfolio-api'
const now = (): number => Math.floor(Date.now() / 1000)

interface Setup { ks: KeyServer, url: string, app: Pick<Built, 'metrics' | 'keySet'>, ping: (token: string) => Promise<{ status: number, body: unknown, retryAfter: string | undefined }> }

async function setup (t: { teardown: (fn: () => unknown) => void }, opts: { ks?: KeyServer, env?: Record<string, string>, keySet?: BuildOptions['keySet'] } = {}): Promise<Setup> {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const ks = opts.ks ?? await startKeyServer()
  t.teardown(ks.close)
  const app = await build(t, {
    upstreamUrl: stub.url,
    env: { JWT_SECRET: '', JWT_JWKS_URL: ks.url, JWT_ISSUER: ISS, JWT_AUDIENCE: AUD, ...opts.env },
    ...(opts.keySet === undefined ? {} : { keySet: opts.keySet })
  })
  async function ping (token: string): Promise<{ status: number, body: unknown, retryAfter: string | undefined }> {
    const res = await request(`${app.url}/api/portfolio/ping`, { headers: bearer(token) })
    const text = await res.body.text()
    const body: unknown = (res.headers['content-type'] ?? '').includes('json') ? JSON.parse(text) : text
    const retryAfter = res.headers['retry-after']
    return { status: res.statusCode, body, retryAfter: typeof retryAfter === 'string' ? retryAfter : undefined }
  }
  return { ks, url: app.url, app, ping }
}

const claims = (extra: Record<string, unknown> = {}): Record<string, unknown> => ({ iss: ISS, aud: AUD, ...extra })
const UNKNOWN_KID = { error: 'token key is not in the key set' }
const UNAVAILABLE = { error: 'identity provider unavailable, retry later' }

t.test('RSA, EC P-256 and Ed25519 keys: each kid verifies its own algorithm; iss and aud are checked', async (t) => {
  const { ks, ping } = await setup(t)
  for (const kid of ['rsa-1', 'ec-1', 'ed-1']) {
    t.same(await ping(await ks.sign(claims({ sub: `user-${kid}` }), kid)), { status: 200, body: 'pong', retryAfter: undefined }, kid)
  }
  t.same((await ping(await ks.sign(claims({ iss: 'https://evil.example/' }), 'rsa-1'))).body, { error: 'token issuer or audience not accepted' })
  t.same((await ping(await ks.sign(claims({ aud: 'other' }), 'rsa-1'))).body, { error: 'token issuer or audience not accepted' })
  t.same((await ping(await ks.sign({ aud: AUD }, 'rsa-1'))).body, { error: 'token lacks a required claim (sub, exp, and iss/aud when configured)' })
  t.same((await ping(await ks.sign(claims({ exp: undefined }), 'rsa-1'))).body, { error: 'token lacks a required claim (sub, exp, and iss/aud when configured)' })
  t.same((await ping(await ks.sign(claims({ sub: 'a\nb' }), 'rsa-1'))).body, { error: 'token sub claim must be 1-256 printable characters' })
  t.same(await ping('not.a.jwt'), { status: 401, body: { error: 'invalid token' }, retryAfter: undefined })
})

t.test('speed: keys fetched once before listen; a first verification and a repeat token cost no fetch', async (t) => {
  const { ks, ping } = await setup(t)
  t.equal(ks.fetches, 1, 'fetched once while starting')
  const token = await ks.sign(claims(), 'ec-1')
  for (let i = 0; i < 5; i++) t.equal((await ping(token)).status, 200)
  t.equal((await ping(await ks.sign(claims({ sub: 'bob' }), 'ed-1'))).status, 200)
  t.equal(ks.fetches, 1, 'no fetch for cached keys nor for cached tokens')
})

t.test('cooldown: a storm of invented kids makes at most one refetch, and each is 401 while the provider answers', async (t) => {
  const { ks, ping } = await setup(t)
  const forged = await Promise.all(Array.from({ length: 40 }, async (_, i) => await ks.sign(claims(), 'rsa-1', { kid: `invented-${i}` })))
  const answers = await Promise.all(forged.map(ping))
  for (const answer of answers) t.same(answer, { status: 401, body: UNKNOWN_KID, retryAfter: undefined })
  // The cooldown counts from the start of the last attempt of any kind: the start fetch.
  t.equal(ks.fetches, 1, 'no refetch for 40 unknown kids within the cooldown of the start fetch')
})

t.test('rotation: a new kid is fetched once the cooldown has passed, and accepted; a storm makes one fetch per cooldown', async (t) => {
  const { ks, ping } = await setup(t, { env: { JWT_JWKS_COOLDOWN_S: '2' } })
  await ks.addKey('rsa', 'rsa-2')
  const token = await ks.sign(claims(), 'rsa-2')
  // Signed now, not after the refetch: 40 RSA signatures take a busy machine long enough to reach past the 2 s
  // cooldown, and the storm would then no longer be "right after the refetch".
  const forged = await Promise.all(
    Array.from({ length: 40 }, async (_, i) => await ks.sign(claims(), 'rsa-1', { kid: `invented-${i}` }))
  )
  // The start fetch began less than 1 s ago: wait until the cooldown has passed by asking again.
  // Unknown kid within the cooldown: 401 and no fetch. Asked again until the cooldown has passed
  // (1 s), the first ask after it fetches the set and accepts the token.
  let answer = await ping(token)
  const deadline = Date.now() + 20_000
  while (answer.status === 401 && Date.now() < deadline) {
    t.same(answer.body, UNKNOWN_KID)
    await new Promise((resolve) => setTimeout(resolve, 100))
    answer = await ping(token)
  }
  t.same(answer, { status: 200, body: 'pong', retryAfter: undefined })
  t.equal(ks.fetches, 2, 'one refetch for the new kid')
  for (const answer of await Promise.all(forged.map(ping))) t.same(answer.body, UNKNOWN_KID)
  t.equal(ks.fetches, 2, 'a storm right after the refetch: no fetch')
})

t.test('a key that leaves the set is distrusted at the next refresh, even for tokens in the verified-token cache', async (t) => {
  const { ks, app, ping } = await setup(t)
  const leaked = await ks.sign(claims(), 'rsa-1')
  const kept = await ks.sign(claims(), 'ec-1')
  t.equal((await ping(leaked)).status, 200, 'verified and cached')
  t.equal((await ping(kept)).status, 200, 'verified and cached')
  ks.removeKey('rsa-1')
  await app.keySet!.refresh()
  t.same(await ping(leaked), { status: 401, body: UNKNOWN_KID, retryAfter: undefined }, 'refused although cached')
  t.equal((await ping(kept)).status, 200, 'a key still published keeps working')
  t.equal(ks.fetches, 2)
})

t.test('outage with the keys cached: tokens keep working', async (t) => {
  const { ks, app, ping } = await setup(t)
  ks.mode = 'fail'
  await app.keySet!.refresh()
  t.equal(await metricOf(app.metrics, 'gateway_jwks_refreshes_total', { result: 'ok' }), 1, 'the start fetch')
  t.equal(await metricOf(app.metrics, 'gateway_jwks_refreshes_total', { result: 'failed' }), 1, 'the refresh that failed')
  t.same(await ping(await ks.sign(claims(), 'rsa-1')), { status: 200, body: 'pong', retryAfter: undefined })
  t.same(await ping(await ks.sign(claims(), 'ed-1')), { status: 200, body: 'pong', retryAfter: undefined })
})

t.test('outage without the key: 503 simple error with Retry-After (seconds until the next attempt), never 401', async (t) => {
  const { ks, app, ping } = await setup(t)
  await ks.addKey('ec', 'ec-2')
  ks.mode = 'fail'
  await app.keySet!.refresh()
  t.equal(await metricOf(app.metrics, 'gateway_jwks_unavailable_total'), 0)
  const answer = await ping(await ks.sign(claims(), 'ec-2'))
  t.equal(answer.status, 503)
  t.same(answer.body, UNAVAILABLE)
  const retryAfter = Number(answer.retryAfter)
  t.ok(retryAfter >= 1 && retryAfter <= 30, `Retry-After ${answer.retryAfter} is within the 30 s cooldown`)
  t.equal(await metricOf(app.metrics, 'gateway_jwks_unavailable_total'), 1, 'counted')
  ks.mode = 'ok'
  await app.keySet!.refresh()
  t.equal((await ping(await ks.sign(claims(), 'ec-2'))).status, 200, 'the provider back: accepted')
})

for (const [mode, what] of [['fail', 'a 500'], ['garbage', 'a body that is not JSON'], ['huge', 'a body over the size bound'], ['hang', 'no answer within the timeout']] as const) {
  t.test(`provider down at start (${what}): the gateway starts, and tokens get 503 until the set can be had`, async (t) => {
    const ks = await startKeyServer()
    ks.mode = mode
    const started = Date.now()
    const { app, ping } = await setup(t, { ks, keySet: { timeoutMs: 300 } })
    t.ok(Date.now() - started < 5_000, 'the start fetch gave up (hang: after the 300 ms timeout)')
    t.equal(await metricOf(app.metrics, 'gateway_jwks_refreshes_total', { result: 'failed' }), 1)
    t.equal(await metricOf(app.metrics, 'gateway_jwks_refreshes_total', { result: 'ok' }), 0)
    const answer = await ping(await ks.sign(claims(), 'rsa-1'))
    t.equal(answer.status, 503)
    t.same(answer.body, UNAVAILABLE)
    t.match(answer.retryAfter, /^\d+$/)
    t.equal(ks.fetches, 1, 'within the cooldown, the 503 made no fetch')
  })
}

t.test('algorithm confusion: HS256 signed with the RSA public key, and an ES256 token under an RSA kid, are refused', async (t) => {
  const { ks, ping } = await setup(t)
  const rsaPem = createPublicKey({ key: ks.keys.get('rsa-1')!.jwk as JsonWebKey, format: 'jwk' }).export({ type: 'spki', format: 'pem' }).toString()
  for (const header of [{ alg: 'HS256', typ: 'JWT', kid: 'rsa-1' }, { alg: 'HS256', typ: 'JWT' }]) {
    const hs = hs256(claims(), rsaPem, header)
    const answer = await ping(hs)
    t.equal(answer.status, 401, `HS256 ${JSON.stringify(header)}`)
  }
  t.same(await ping(await ks.sign(claims(), 'ec-1', { kid: 'rsa-1' })), { status: 401, body: { error: 'invalid token' }, retryAfter: undefined }, 'ES256 under an RSA kid')
  t.same(await ping(await ks.sign(claims(), 'rsa-1', { alg: 'RS512' })), { status: 401, body: { error: 'invalid token' }, retryAfter: undefined }, 'another RSA algorithm than the pinned RS256')
})

t.test('no kid: refused when the set holds several keys, accepted when it holds one', async (t) => {
  const several = await setup(t)
  t.same(await several.ping(await several.ks.sign(claims(), 'rsa-1', { kid: undefined })), { status: 401, body: { error: 'token has no kid and the key set holds several keys' }, retryAfter: undefined })
  const one = await setup(t, { ks: await startKeyServer([['ec', 'only']]) })
  t.equal((await one.ping(await one.ks.sign(claims(), 'only', { kid: undefined }))).status, 200)
})

t.test('keys with use "enc" and oct keys are ignored', async (t) => {
  const ks = await startKeyServer([['rsa', 'sig-1'], ['rsa', 'enc-1']])
  const secret = 'a-shared-secret-a-shared-secret-0'
  ks.publish((jwks) => [
    ...jwks.map((jwk) => jwk.kid === 'enc-1' ? { ...jwk, use: 'enc' } : { ...jwk, use: 'sig' }),
    { kty: 'oct', kid: 'oct-1', k: Buffer.from(secret).toString('base64url') }
  ])
  const { ping } = await setup(t, { ks })
  t.equal((await ping(await ks.sign(claims(), 'sig-1'))).status, 200)
  t.same((await ping(await ks.sign(claims(), 'enc-1'))).body, UNKNOWN_KID)
  t.same((await ping(hs256(claims(), secret, { alg: 'HS256', typ: 'JWT', kid: 'oct-1' }))).body, UNKNOWN_KID)
})

t.test('clock tolerance (default 5 s) on exp and nbf', async (t) => {
  const { ks, ping } = await setup(t)
  t.equal((await ping(await ks.sign(claims({ exp: now() - 2 }), 'rsa-1'))).status, 200, 'exp 2 s ago: within tolerance')
  t.same((await ping(await ks.sign(claims({ exp: now() - 30 }), 'rsa-1'))).body, { error: 'token expired' })
  t.equal((await ping(await ks.sign(claims({ nbf: now() + 2 }), 'rsa-1'))).status, 200, 'nbf in 2 s: within tolerance')
  t.same((await ping(await ks.sign(claims({ nbf: now() + 60 }), 'rsa-1'))).body, { error: 'token not yet valid' })
})

t.test('background refresh before expiry (Cache-Control max-age) distrusts a removed key with no request asking', async (t) => {
  const ks = await startKeyServer()
  ks.cacheControl = 'public, max-age=1'
  const { app, ping } = await setup(t, { ks, env: { JWT_JWKS_COOLDOWN_S: '1' }, keySet: { minMaxAgeMs: 1000 } })
  const token = await ks.sign(claims(), 'rsa-1')
  t.equal((await ping(token)).status, 200, 'verified and cached')
  ks.removeKey('rsa-1')
  const refreshed = async (): Promise<number | undefined> => metricOf(app.metrics, 'gateway_jwks_refreshes_total', { result: 'ok' })
  await ks.nextFetch()
  // The provider has answered; wait for the gateway to take the new set in.
  while (await refreshed() === 1) await new Promise((resolve) => setImmediate(resolve))
  t.equal(await refreshed(), 2, 'refreshed on its own, at 80% of max-age (no sooner than the cooldown)')
  t.equal(ks.fetches, 2)
  t.same(await ping(token), { status: 401, body: UNKNOWN_KID, retryAfter: undefined })
})

t.test('Cache-Control max-age sets the refresh, within [60 s, 24 h]; 10 min without one', async (t) => {
  t.equal(maxAgeMs('public, max-age=600'), 600_000)
  t.equal(maxAgeMs('max-age=1'), 60_000)
  t.equal(maxAgeMs('max-age=99999999'), 24 * 3600_000)
  t.equal(maxAgeMs(undefined), 600_000)
})

t.test('the verified-token cache holds a hash of the token, not its bytes', async (t) => {
  const cache = new TokenCache()
  const huge = 'eyJ' + 'A'.repeat(16 * 1024)
  cache.set(huge, { userId: 'alice' }, Date.now() + 60_000)
  const keys = [...cache.lru.keys()]
  t.same(keys.map((k) => k.length), [43], 'one key of 43 characters (SHA-256, base64url)')
  t.equal(cache.get(huge)?.userId, 'alice')
  cache.set('expired', { userId: 'bob' }, Date.now() - 1)
  t.equal(cache.get('expired'), undefined, 'an already expired token is not cached')
  cache.delete(huge)
  t.equal(cache.lru.size, 0)
})
