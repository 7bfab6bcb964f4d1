/**
 * The gateway against a real OpenID provider (fixtures/oidc-provider.ts,
 * oidc-provider in-process), over real sockets: client-credentials JWT access
 * tokens with iss and aud, then a key rotation and the retirement of the old key.
 */
import t from 'tap'
import { request } from 'undici'
import { bearer, build } from '../helpers/app.js'
import { startOidcProvider } from '../../fixtures/oidc-provider.js'
import { startStubUpstream } from '../../fixtures/stub-upstream.js'
import { decodeProtectedHeader } from 'jose'

t.test('tokens from a real OpenID provider are accepted across a key rotation; a retired key is refused even when cached', async (t) => {
  const idp = await startOidcProvider()
  t.teardown(idp.close)
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { keySet, url } = await build(t, {
    upstreamUrl: stub.url,
    env: { JWT_SECRET: '', JWT_JWKS_URL: idp.jwksUrl, JWT_ISSUER: idp.issuer, JWT_AUDIENCE: idp.audience, JWT_JWKS_COOLDOWN_S: '1' }
  })
  const ping = async (token: string): Promise<{ status: number, body: string }> => {
    const res = await request(`${url}/api/portfolio/ping`, { headers: bearer(token) })
    return { status: res.statusCode, body: await res.body.text() }
  }

  const oldToken = await idp.token()
  const oldKid = idp.currentKid
  t.equal(decodeProtectedHeader(oldToken).kid, oldKid)
  t.same(await ping(oldToken), { status: 200, body: 'pong' }, 'a client-credentials access token is accepted (and now cached)')
  t.equal(stub.requests.at(-1)?.headers['x-user-id'], 'mobile-backend', 'its sub is the identity the engine sees')

  await idp.rotate()
  const newToken = await idp.token()
  t.not(decodeProtectedHeader(newToken).kid, oldKid, 'the provider signs with the new key')
  // The new kid is fetched on first sight once the 1 s cooldown since the start fetch has passed.
  let answer = await ping(newToken)
  const deadline = Date.now() + 20_000
  while (answer.status === 401 && Date.now() < deadline) {
    t.same(JSON.parse(answer.body), { error: 'token key is not in the key set' }, 'within the cooldown')
    await new Promise((resolve) => setTimeout(resolve, 100))
    answer = await ping(newToken)
  }
  t.same(answer, { status: 200, body: 'pong' }, 'a token signed with the rotated-in key is accepted')
  t.same(await ping(oldToken), { status: 200, body: 'pong' }, 'the old key is still published: its tokens still work')

  await idp.retireOldKeys()
  await keySet!.refresh()
  t.same(await ping(oldToken), { status: 401, body: '{"error":"token key is not in the key set"}' }, 'the retired key is distrusted, although its token was cached')
  t.same(await ping(newToken), { status: 200, body: 'pong' })
  t.same(await ping(await idp.token()), { status: 200, body: 'pong' }, 'a fresh token too')
})
