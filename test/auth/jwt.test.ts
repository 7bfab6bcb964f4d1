/** Bearer JWT on every /api route: each bad token is a 401 simple error and the handler never runs. */
import t from 'tap'
import { bearer, build, hs256, keyPair, signAsymmetric, unsigned } from '../helpers/app.js'
import { startStubUpstream } from '../../fixtures/stub-upstream.js'

const ROUTES = [
  { method: 'GET', url: '/api/health' },
  { method: 'GET', url: '/api/portfolio/ping' },
  { method: 'POST', url: '/api/portfolio/update' },
  { method: 'POST', url: '/api/portfolio/create' }
] as const

const now = (): number => Math.floor(Date.now() / 1000)

const BAD_TOKENS: Array<[string, Record<string, string>, string]> = [
  ['missing', {}, 'missing bearer token'],
  ['not bearer', { authorization: 'Basic YWxpY2U6c2VjcmV0' }, 'authorization header must be: Bearer <token>'],
  ['malformed', bearer('not-a-jwt'), 'invalid token'],
  ['expired', bearer(hs256({ exp: now() - 10 })), 'token expired'],
  ['not yet valid', bearer(hs256({ nbf: now() + 600 })), 'token not yet valid'],
  ['wrong key', bearer(hs256({}, 'another-secret-another-secret-another-0')), 'invalid token'],
  ['alg none', bearer(unsigned()), 'invalid token'],
  ['HS512 instead of pinned HS256', bearer(hs256({}, undefined, { alg: 'HS512', typ: 'JWT' })), 'invalid token'],
  ['no sub', bearer(hs256({ sub: undefined })), 'token lacks a required claim (sub, exp, and iss/aud when configured)'],
  ['no exp', bearer(hs256({ exp: undefined })), 'token lacks a required claim (sub, exp, and iss/aud when configured)'],
  ['sub not a string', bearer(hs256({ sub: 42 })), 'token sub claim must be 1-256 printable characters'],
  ['sub with a newline', bearer(hs256({ sub: 'alice\nx-admin: 1' })), 'token sub claim must be 1-256 printable characters']
]

t.test('bad tokens get 401 { error } on every bearer route, and nothing reaches the engine', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { app } = await build(t, { upstreamUrl: stub.url })
  for (const route of ROUTES) {
    for (const [name, headers, message] of BAD_TOKENS) {
      const res = await app.inject({ method: route.method, url: route.url, headers })
      t.equal(res.statusCode, 401, `${route.method} ${route.url}: ${name}`)
      t.same(res.json(), { error: message }, `${route.method} ${route.url}: ${name} body`)
      t.notMatch(res.body, /eyJ/, 'the token is not echoed')
    }
  }
  t.equal(stub.requests.length, 0, 'no request reached the engine')
})

t.test('a valid token passes and its sub is the x-user-id the engine sees', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { app } = await build(t, { upstreamUrl: stub.url })
  const res = await app.inject({ method: 'GET', url: '/api/portfolio/ping', headers: { ...bearer(hs256({ sub: 'bob' })), 'x-user-id': 'mallory' } })
  t.equal(res.statusCode, 200)
  t.equal(stub.requests[0]?.headers['x-user-id'], 'bob', 'the client-sent x-user-id is replaced by the verified sub')
})

t.test('a cached token stops working at exp', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  // No clock tolerance here: the test is about exp itself (tolerance: test/auth/jwks.test.ts).
  const { app } = await build(t, { upstreamUrl: stub.url, env: { JWT_CLOCK_TOLERANCE_S: '0' } })
  const token = hs256({ exp: now() + 2 })
  const first = await app.inject({ method: 'GET', url: '/api/portfolio/ping', headers: bearer(token) })
  t.equal(first.statusCode, 200, 'valid before exp (and now cached)')
  await new Promise((resolve) => setTimeout(resolve, 2100))
  const second = await app.inject({ method: 'GET', url: '/api/portfolio/ping', headers: bearer(token) })
  t.equal(second.statusCode, 401)
  t.same(second.json(), { error: 'token expired' })
})

t.test('iss and aud are checked when configured', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { app } = await build(t, { upstreamUrl: stub.url, env: { JWT_ISSUER: 'https://id.example', JWT_AUDIENCE: 'portfolio' } })
  const good = await app.inject({ method: 'GET', url: '/api/portfolio/ping', headers: bearer(hs256({ iss: 'https://id.example', aud: 'portfolio' })) })
  t.equal(good.statusCode, 200)
  for (const claims of [{ iss: 'https://evil.example', aud: 'portfolio' }, { iss: 'https://id.example', aud: 'other' }]) {
    const res = await app.inject({ method: 'GET', url: '/api/portfolio/ping', headers: bearer(hs256(claims)) })
    t.equal(res.statusCode, 401)
    t.same(res.json(), { error: 'token issuer or audience not accepted' })
  }
  const missing = await app.inject({ method: 'GET', url: '/api/portfolio/ping', headers: bearer(hs256()) })
  t.equal(missing.statusCode, 401, 'a token without iss/aud is refused when they are configured')
})

for (const [type, alg] of [['rsa', 'RS256'], ['ec', 'ES256']] as const) {
  t.test(`${alg} with JWT_PUBLIC_KEY: the key's algorithm only`, async (t) => {
    const stub = await startStubUpstream()
    t.teardown(stub.close)
    const { publicKey, privateKey } = keyPair(type)
    const { app } = await build(t, { upstreamUrl: stub.url, env: { JWT_PUBLIC_KEY: publicKey, JWT_SECRET: '' } })
    const good = await app.inject({ method: 'GET', url: '/api/portfolio/ping', headers: bearer(signAsymmetric(alg, privateKey)) })
    t.equal(good.statusCode, 200)
    // The classic confusion attack: HS256 signed with the public key's text as the secret.
    const confused = await app.inject({ method: 'GET', url: '/api/portfolio/ping', headers: bearer(hs256({}, publicKey)) })
    t.equal(confused.statusCode, 401)
    t.same(confused.json(), { error: 'invalid token' })
    const other = keyPair(type)
    const foreign = await app.inject({ method: 'GET', url: '/api/portfolio/ping', headers: bearer(signAsymmetric(alg, other.privateKey)) })
    t.equal(foreign.statusCode, 401)
  })
}

t.test('public routes need no token', async (t) => {
  const { app } = await build(t)
  t.equal((await app.inject('/health')).statusCode, 200)
  t.equal((await app.inject('/ping')).statusCode, 200)
})
