/**
 * Per-user rate limits (DECISIONS 14) with the in-process store, over real
 * sockets: exact headers and bodies, 401s never count, public routes never limited.
 */
import { PassThrough } from 'node:stream'
import t from 'tap'
import { request } from 'undici'
import { startStubUpstream } from '../../fixtures/stub-upstream.js'
import { bearer, build, hs256 } from '../helpers/app.js'
import { clearOfWindowEdge } from '../helpers/window.js'
import { metricOf } from '../helpers/prometheus.js'

async function get (url: string, headers: Record<string, string> = {}) {
  const res = await request(url, { headers })
  const text = await res.body.text()
  return { status: res.statusCode, headers: res.headers, text }
}

t.test('past RATE_LIMIT_PER_MINUTE a user gets 429 with Retry-After and the IETF RateLimit headers', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(() => stub.close())
  const { metrics, url } = await build(t, { upstreamUrl: stub.url, env: { RATE_LIMIT_PER_MINUTE: '3' } })
  await clearOfWindowEdge()
  const alice = bearer(hs256({ sub: 'alice' }))

  // A flood of bad tokens for alice is refused by auth and never counted.
  for (let i = 0; i < 5; i++) {
    const bad = await get(`${url}/api/portfolio/ping`, bearer(hs256({ sub: 'alice' }, 'wrong-secret-wrong-secret-wrong-secret')))
    t.equal(bad.status, 401)
    t.equal(bad.headers['ratelimit'], undefined, 'a 401 carries no rate-limit state')
  }

  const remaining: string[] = []
  // All /api/* routes count together, /api/health included.
  for (const path of ['/api/portfolio/ping', '/api/health', '/api/portfolio/ping']) {
    const ok = await get(url + path, alice)
    t.equal(ok.status, 200, path)
    t.equal(ok.headers['ratelimit-policy'], '"default";q=3;w=60')
    remaining.push(String(ok.headers['ratelimit']))
  }
  t.match(remaining, [/^"default";r=2;t=\d+$/, /^"default";r=1;t=\d+$/, /^"default";r=0;t=\d+$/])

  const refused = await get(`${url}/api/portfolio/ping`, alice)
  t.equal(refused.status, 429)
  t.same(JSON.parse(refused.text), { error: 'rate limit exceeded' })
  t.ok(refused.headers['x-request-id'], 'carries the request id')
  t.equal(refused.headers['ratelimit-policy'], '"default";q=3;w=60')
  const m = /^"default";r=0;t=(\d+)$/.exec(String(refused.headers['ratelimit']))
  t.ok(m, 'RateLimit says none remain')
  const reset = Number(m![1])
  t.ok(reset >= 1 && reset <= 60, `t=${reset} is within the 60 s window`)
  t.equal(refused.headers['retry-after'], String(reset), 'Retry-After: whole seconds to the window reset')
  t.equal(stub.requests.filter((r) => r.url === '/api/portfolio/ping').length, 2, 'the refused request never reached the engine')
  t.equal(await metricOf(metrics, 'gateway_rejections_total', { reason: 'rate_limit' }), 1, 'the 429 counted')
  t.equal(await metricOf(metrics, 'gateway_rejections_total', { reason: 'auth' }), 5, 'the bad tokens counted as auth, not rate limit')

  // Another user has a window of their own.
  const bob = await get(`${url}/api/portfolio/ping`, bearer(hs256({ sub: 'bob' })))
  t.equal(bob.status, 200)
  t.match(String(bob.headers['ratelimit']), /^"default";r=2;t=\d+$/)

  // Public routes are never limited and carry no rate-limit headers.
  for (const path of ['/health', '/ping']) {
    const open = await get(url + path, alice)
    t.equal(open.status, 200, path)
    t.equal(open.headers['ratelimit'], undefined)
  }
})

t.test('a refused POST closes the connection: its body is never read (DECISIONS 21)', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(() => stub.close())
  const { url } = await build(t, { upstreamUrl: stub.url, env: { RATE_LIMIT_PER_MINUTE: '1' } })
  await clearOfWindowEdge()
  const alice = bearer()
  t.equal((await get(`${url}/api/portfolio/ping`, alice)).status, 200)
  // A body that is still coming when the answer is due.
  const body = new PassThrough()
  body.write('{"portfolio_id":"p-1",')
  t.teardown(() => body.destroy())
  const res = await request(`${url}/api/portfolio/update`, { method: 'POST', headers: { ...alice, 'content-type': 'application/json', 'content-length': '1000' }, body })
  t.equal(res.statusCode, 429)
  t.equal(res.headers['connection'], 'close')
  t.same(await res.body.json(), { error: 'rate limit exceeded' })
  t.equal(stub.requests.length, 1)
})

t.test('RATE_LIMIT_PER_MINUTE=0 turns the limit off', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(() => stub.close())
  const { url } = await build(t, { upstreamUrl: stub.url, env: { RATE_LIMIT_PER_MINUTE: '0' } })
  for (let i = 0; i < 3; i++) {
    const res = await get(`${url}/api/portfolio/ping`, bearer())
    t.equal(res.status, 200)
    t.equal(res.headers['ratelimit'], undefined)
    t.equal(res.headers['ratelimit-policy'], undefined)
  }
})
