/**
 * The gateway as a real process (src/server.ts, src/cli/token.ts): refusing bad
 * configuration with one line, the development path with the embedded engine,
 * and the token CLI. Shutdown and the metrics listener are in
 * test/server-shutdown.test.ts (one file took most of tap's per-file limit on a busy runner).
 */
import { createHmac } from 'node:crypto'
import t from 'tap'
import { request } from 'undici'
import { contractHandler, startStubUpstream } from '../fixtures/stub-upstream.js'
import { bearer, build, MINTS, SECRET } from './helpers/app.js'
import { multipartBody } from './helpers/multipart.js'
import { ensureBuilt } from './helpers/processes.js'
import { client, exitOf, gatewayUrl, lines, SERVER, start, TOKEN_CLI, WAIT_MS } from './helpers/gateway-process.js'

// Thirteen gateway and CLI processes, one after another, each about a second of CPU to start: 30-40 s
// on a quiet 2-core runner, and past tap's 60 s at a load average of 6 to 9 with every assertion green.
t.setTimeout(180_000)
t.before(ensureBuilt)

t.test('production without a JWT key exits 1 with one line', async (t) => {
  const child = start(t, SERVER, { NODE_ENV: 'production', PORT: '0' })
  t.same(await exitOf(child), { code: 1, signal: null })
  t.same(lines(child.err()), [
    'portfolio-gateway: NODE_ENV=production needs a JWT key: set JWT_SECRET (HS256, 32+ characters), JWT_PUBLIC_KEY (PEM, RS256/ES256) or JWT_JWKS_URL (your identity provider)'
  ])
  t.equal(child.out(), '', 'nothing on stdout: it never started')
})

t.test('production without UPSTREAM_URL exits 1 with one line (DECISIONS 20)', async (t) => {
  const child = start(t, SERVER, { NODE_ENV: 'production', PORT: '0', JWT_SECRET: SECRET, METRICS_PORT: '0' })
  t.same(await exitOf(child), { code: 1, signal: null })
  t.same(lines(child.err()), [
    "portfolio-gateway: NODE_ENV=production needs UPSTREAM_URL: set it to the engine's base URL, e.g. http://engine:4000 (the embedded engine keeps data in memory)"
  ])
  t.equal(child.out(), '', 'nothing on stdout: it never started')
})

t.test('a malformed PORT exits 1 with one line naming it', async (t) => {
  const child = start(t, SERVER, { PORT: 'abc', JWT_SECRET: SECRET })
  t.same(await exitOf(child), { code: 1, signal: null })
  t.same(lines(child.err()), ['portfolio-gateway: PORT="abc" is invalid: must be a whole number; expected listen port'])
  t.equal(child.out(), '')
})

t.test('development with no key and no UPSTREAM_URL: embedded engine and a printed token', async (t) => {
  const child = start(t, SERVER, { PORT: '0', HOST: '127.0.0.1', LOG_LEVEL: 'info' })
  const [, token] = (await child.waitForOutput(/export TOKEN=(\S+)/)) as [string, string]
  const url = await gatewayUrl(child)
  const dispatcher = client(t)
  const auth = bearer(token)

  const ping = await request(`${url}/api/portfolio/ping`, { dispatcher, headers: auth })
  t.equal(ping.statusCode, 200)
  t.equal(await ping.body.text(), 'pong')

  const health = await request(`${url}/api/health`, { dispatcher, headers: auth })
  t.equal(health.statusCode, 200)
  t.match(await health.body.json(), { status: 'ok', services: { database: 'connected', cache: 'connected' } })

  const form = multipartBody([
    { name: 'name', value: 'Process test' },
    { name: 'type', value: 'PORTFOLIO' }
  ])
  const created = await request(`${url}/api/portfolio/create`, {
    dispatcher,
    method: 'POST',
    headers: { ...auth, 'content-type': form.contentType },
    body: form.body
  })
  t.equal(created.statusCode, 200, 'create')
  const { portfolio_id: id } = (await created.body.json()) as { portfolio_id: string }
  t.type(id, 'string')

  const updated = await request(`${url}/api/portfolio/update`, {
    dispatcher,
    method: 'POST',
    headers: { ...auth, 'content-type': 'application/json' },
    body: JSON.stringify({
      portfolio_id: id,
      target_positions: [
        { mint: MINTS[0], allocation: 0.25 },
        { mint: MINTS[1], allocation: 0.75 }
      ]
    })
  })
  t.equal(updated.statusCode, 200, 'update of the portfolio just created')
  t.same(await updated.body.json(), { success: true, message: 'Target positions updated' })

  child.proc.kill('SIGTERM')
  t.same(await exitOf(child), { code: 0, signal: null }, 'SIGTERM closes gateway and engine cleanly')
  t.equal(child.err(), '', 'nothing on stderr')
})

t.test('SIGTERM with a request in flight: it is answered, then exit 0, and no token in the logs', async (t) => {
  const stub = await startStubUpstream((req, res, body) => {
    if (req.url !== '/api/portfolio/ping') return contractHandler(req, res, body)
    setTimeout(() => contractHandler(req, res, body), 500)
  })
  t.teardown(stub.close)
  // trace: the most the gateway ever logs, so the leak check covers every line.
  const child = start(t, SERVER, {
    PORT: '0',
    HOST: '127.0.0.1',
    LOG_LEVEL: 'trace',
    JWT_SECRET: SECRET,
    UPSTREAM_URL: stub.url
  })
  await child.waitForOutput(/gateway ready/)
  const url = await gatewayUrl(child)
  const token = bearer().authorization!.slice('Bearer '.length)

  const inFlight = request(`${url}/api/portfolio/ping`, { dispatcher: client(t), headers: bearer(token) })
  const deadline = Date.now() + WAIT_MS
  while (stub.stats.started === 0 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 10))
  t.equal(stub.stats.started, 1, 'the ping reached the engine before the signal')
  child.proc.kill('SIGTERM')

  const res = await inFlight
  t.equal(res.statusCode, 200)
  t.equal(await res.body.text(), 'pong')
  t.same(await exitOf(child), { code: 0, signal: null })

  const logs = child.out() + child.err()
  t.match(logs, /draining/, 'the shutdown is logged')
  t.notMatch(logs, token, 'the token is not logged')
  t.notMatch(logs, token.split('.')[2]!, 'nor its signature')
  t.notMatch(logs, /bearer/i, 'nor the authorization header')
  t.notMatch(logs, SECRET, 'nor the secret')
})

t.test('token CLI: prints a JWT the gateway accepts', async (t) => {
  const child = start(t, TOKEN_CLI, { JWT_SECRET: SECRET }, ['--sub', 'alice'])
  t.same(await exitOf(child), { code: 0, signal: null })
  t.equal(child.err(), '')
  const printed = lines(child.out())
  t.equal(printed.length, 1, 'one line: the token')
  const token = printed[0]!
  const [header, payload, signature] = token.split('.') as [string, string, string]
  t.match(JSON.parse(Buffer.from(header, 'base64url').toString()), { alg: 'HS256' })
  const claims = JSON.parse(Buffer.from(payload, 'base64url').toString()) as { sub: string; exp: number; iat: number }
  t.equal(claims.sub, 'alice')
  t.equal(claims.exp - claims.iat, 3600, 'expires in one hour by default')
  t.equal(
    signature,
    createHmac('sha256', SECRET).update(`${header}.${payload}`).digest('base64url'),
    'signed with JWT_SECRET'
  )

  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const res = await request(`${url}/api/portfolio/ping`, { dispatcher: client(t), headers: bearer(token) })
  t.equal(res.statusCode, 200)
  t.equal(await res.body.text(), 'pong')
  t.equal(stub.requests[0]?.headers['x-user-id'], 'alice', 'the engine is told the sub')
})

t.test('token CLI without a key exits 1 with one line', async (t) => {
  const child = start(t, TOKEN_CLI, {}, ['--sub', 'alice'])
  t.same(await exitOf(child), { code: 1, signal: null })
  t.same(lines(child.err()), [
    'token: no JWT_SECRET or JWT_PUBLIC_KEY is set: set the same one the gateway runs with, e.g. export JWT_SECRET=$(openssl rand -hex 32)'
  ])
  t.equal(child.out(), '')
})

t.test('token CLI refuses a sub the gateway would refuse, with one line', async (t) => {
  const message =
    'token: --sub must be 1-256 visible ASCII characters (no spaces or control characters), the rule the gateway applies to sub'
  for (const sub of ['a b', '', 'x'.repeat(257), 'caf\u00e9']) {
    const child = start(t, TOKEN_CLI, { JWT_SECRET: SECRET }, ['--sub', sub])
    t.same(await exitOf(child), { code: 1, signal: null }, JSON.stringify(sub))
    t.same(lines(child.err()), [message], JSON.stringify(sub))
    t.equal(child.out(), '', 'no token printed')
  }
  const longest = start(t, TOKEN_CLI, { JWT_SECRET: SECRET }, ['--sub', 'x'.repeat(256)])
  t.same(await exitOf(longest), { code: 0, signal: null }, '256 characters is the longest sub allowed')
  t.equal(lines(longest.out()).length, 1)
})

t.test('token CLI in key-set mode exits 1 with one line: tokens come from the identity provider', async (t) => {
  const child = start(t, TOKEN_CLI, { JWT_JWKS_URL: 'https://id.example/jwks', JWT_ISSUER: 'https://id.example/' }, [
    '--sub',
    'alice'
  ])
  t.same(await exitOf(child), { code: 1, signal: null })
  t.same(lines(child.err()), [
    'token: JWT_JWKS_URL is set: tokens come from your identity provider, not from this tool (unset JWT_JWKS_URL to mint test tokens)'
  ])
  t.equal(child.out(), '')
})

/** A port some other process holds for the whole test. */
