/**
 * The document is the contract: the answers it was missing (401 challenges,
 * 405, 417, the engine's 503, the 409's Retry-After), the request headers at
 * their boundaries as the schema and the server see them, the answer check
 * catching what it must, and the linters client teams run.
 */
import { execFile, spawn } from 'node:child_process'
import { once } from 'node:events'
import { readFileSync } from 'node:fs'
import { connect } from 'node:net'
import { join } from 'node:path'
import { promisify } from 'node:util'
import { Ajv2020 } from 'ajv/dist/2020.js'
import Fastify from 'fastify'
import t from 'tap'
import { request } from 'undici'
import { contractHandler, json, startStubUpstream } from '../../fixtures/stub-upstream.js'
import { bearer, build, hs256, SECRET, validUpdate } from '../helpers/app.js'
import { checkInjects, violationsOf, violationsOfRaw } from '../helpers/answer-check.js'
import { CREATE_FIELDS, multipartBody } from '../helpers/multipart.js'
import { ANSWER_CHECK, assertAnswersDeclared, ROOT } from '../helpers/processes.js'
import { pathToFileURL } from 'node:url'

const run = promisify(execFile)
const MALFORMED = 'authorization header must be: Bearer <token>'
const INVALID = 'Bearer error="invalid_token"'
const updateRequest = (headers: Record<string, string> = {}) => ({
  method: 'POST' as const,
  headers: { ...bearer(), 'content-type': 'application/json', ...headers },
  body: JSON.stringify(validUpdate())
})
const bin = (...path: string[]) => join(ROOT, 'node_modules', ...path)
const doc = JSON.parse(readFileSync(join(ROOT, 'openapi.json'), 'utf8')) as {
  paths: Record<string, Record<string, { parameters: Array<{ name: string, schema: object }> }>>
}

t.test('401 challenges (RFC 6750 section 3): bare without a bearer token, invalid_token for a refused one', async t => {
  const { url } = await build(t)
  const cases: Array<[string, Record<string, string>, string, string]> = [
    ['no token', {}, 'Bearer', 'missing bearer token'],
    ['Basic auth', { authorization: 'Basic YWxpY2U6c2VjcmV0' }, 'Bearer', MALFORMED],
    ['a bad signature', bearer(hs256({}, `${SECRET}-not`)), INVALID, 'invalid token'],
    ['an expired token', bearer(hs256({ exp: 1 })), INVALID, 'token expired'],
    ['a malformed bearer token', { authorization: 'Bearer not a token' }, INVALID, MALFORMED]
  ]
  for (const [name, headers, challenge, message] of cases) {
    const res = await request(`${url}/api/portfolio/ping`, { headers })
    t.equal(res.statusCode, 401, name)
    t.equal(res.headers['www-authenticate'], challenge, `${name}: the challenge`)
    t.same(await res.body.json(), { error: message }, `${name}: the body`)
  }
})

t.test('a known path with another method is 405 with Allow; an unknown path stays 404', async (t) => {
  const { url } = await build(t)
  const get = await request(`${url}/api/portfolio/update`, { headers: bearer() })
  t.equal(get.statusCode, 405)
  t.equal(get.headers['allow'], 'POST')
  t.same(await get.body.json(), { error: 'GET not allowed on /api/portfolio/update: use POST' })
  const post = await request(`${url}/health?x=1`, { method: 'POST', body: '' })
  t.equal(post.statusCode, 405)
  t.equal(post.headers['allow'], 'GET, HEAD')
  t.same(await post.body.json(), { error: 'POST not allowed on /health: use GET, HEAD' })
  const unknown = await request(`${url}/healthz`)
  t.equal(unknown.statusCode, 404)
  t.equal(unknown.headers['allow'], undefined)
  t.same(await unknown.body.json(), { error: 'no route GET /healthz' })
})

t.test('an Expect other than 100-continue is 417, as the document says', async (t) => {
  const { url } = await build(t)
  const socket = connect(Number(new URL(url).port), '127.0.0.1')
  t.teardown(() => socket.destroy())
  socket.write('GET /ping HTTP/1.1\r\nHost: x\r\nExpect: something-else\r\n\r\n')
  let raw = ''
  for await (const chunk of socket) {
    raw += String(chunk)
    if (raw.includes('}')) break
  }
  t.match(raw, /^HTTP\/1\.1 417 Expectation Failed\r\n/)
  t.match(raw, /\r\nx-request-id: [0-9a-f-]{36}\r\n/)
  t.match(raw, /\r\n\r\n\{"error":"unsupported Expect header: only 100-continue is accepted"\}$/)
})

t.test("the engine's 503 (its store is down) is the simple 503 with the engine's Retry-After", async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const unavailable = {
    success: false,
    error: {
      source: 'portfolio-engine',
      code: 'SERVICE_UNAVAILABLE',
      message: 'portfolio store unavailable, retry later',
      function: 'updatePortfolio'
    }
  }
  for (const [given, passed] of [['3', '3'], [undefined, '1'], ['Wed, 21 Oct 2026 07:28:00 GMT', '1']] as const) {
    stub.handle((_req, res) => {
      if (given !== undefined) res.setHeader('retry-after', given)
      json(res, 503, unavailable)
    })
    const res = await request(`${url}/api/portfolio/update`, updateRequest())
    t.equal(res.statusCode, 503)
    t.equal(res.headers['retry-after'], passed, `the engine's ${String(given)} is passed on as ${passed}`)
    t.same(await res.body.json(), { error: 'portfolio engine unavailable, retry later' })
  }
  stub.handle((_req, res) => json(res, 418, { ...unavailable, error: { ...unavailable.error, code: 'TEAPOT' } }))
  const odd = await request(`${url}/api/portfolio/update`, updateRequest())
  t.equal(odd.statusCode, 502, 'a status the contract does not name is not passed on')
  t.same(await odd.body.json(), { error: 'portfolio engine sent an invalid response' })
})

t.test("the engine's Retry-After: an HTTP-date as delta-seconds, capped at an hour; its 429 is the 503", async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const unavailable = {
    success: false,
    error: { source: 'portfolio-engine', code: 'SERVICE_UNAVAILABLE', message: 'later', function: 'updatePortfolio' }
  }
  const inTwoMinutes = new Date(Date.now() + 120_000).toUTCString()
  const cases: Array<[number, string, (passed: number) => boolean, string]> = [
    [503, inTwoMinutes, (s) => s >= 119 && s <= 120, 'an HTTP-date two minutes ahead: about 120 s'],
    [503, new Date(Date.now() + 86_400_000).toUTCString(), (s) => s === 3600, 'an HTTP-date a day ahead: capped'],
    [503, '999999999', (s) => s === 3600, 'a huge delta: capped at 3600'],
    [503, '3.5', (s) => s === 1, 'neither form: 1'],
    [429, '7', (s) => s === 7, "the engine's 429 with 7"],
    [429, inTwoMinutes, (s) => s >= 119 && s <= 120, "the engine's 429 with an HTTP-date"]
  ]
  for (const [status, given, expected, name] of cases) {
    stub.handle((_req, res) => {
      res.setHeader('retry-after', given)
      json(res, status, unavailable)
    })
    const res = await request(`${url}/api/portfolio/update`, updateRequest())
    t.equal(res.statusCode, 503, `${name}: 503`)
    t.ok(expected(Number(res.headers['retry-after'])), `${name}: Retry-After ${String(res.headers['retry-after'])}`)
    t.same(await res.body.json(), { error: 'portfolio engine unavailable, retry later' })
  }
  stub.handle((_req, res) => json(res, 429, { error: 'slow down' }))
  const ping = await request(`${url}/api/portfolio/ping`, { headers: bearer() })
  t.equal(ping.statusCode, 503, "a ping's engine 429 without Retry-After is the 503 too")
  t.equal(ping.headers['retry-after'], '1')
  t.same(await ping.body.json(), { error: 'portfolio engine unavailable, retry later' })
})

t.test("the engine's error passes only with a code the document declares for its status; else 502", async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const engineError = (status: number, code: string) => (_req: unknown, res: Parameters<typeof json>[0]) =>
    json(res, status, { success: false, error: { source: 'portfolio-engine', code, message: 'm', function: 'f' } })
  const form = multipartBody(CREATE_FIELDS)
  const calls = {
    create: async (headers: Record<string, string> = {}) => await request(`${url}/api/portfolio/create`, {
      method: 'POST', headers: { ...bearer(), 'content-type': form.contentType, ...headers }, body: form.body
    }),
    update: async (headers: Record<string, string> = {}) =>
      await request(`${url}/api/portfolio/update`, updateRequest(headers)),
    ping: async (headers: Record<string, string> = {}) =>
      await request(`${url}/api/portfolio/ping`, { headers: { ...bearer(), ...headers } })
  }
  const cases: Array<[keyof typeof calls, number, string]> = [
    ['create', 400, 'INVALID_IMAGE'], ['create', 422, 'VALIDATION_ERROR'], ['create', 500, 'NOT_FOUND'],
    ['update', 400, 'INVALID_IMAGE'], ['update', 404, 'INTERNAL_ERROR'], ['update', 422, 'CONFLICT'],
    ['update', 500, 'VALIDATION_ERROR'], ['ping', 500, 'PING_FAILED']
  ]
  for (const [call, status, code] of cases) {
    stub.handle(engineError(status, code))
    const res = await calls[call]()
    t.equal(res.statusCode, 502, `${call}: the engine's ${status} ${code} is outside the contract`)
    t.same(await res.body.json(), { error: 'portfolio engine sent an invalid response' })
  }
  const declared: Array<[keyof typeof calls, number, string]> = [
    ['create', 400, 'VALIDATION_ERROR'], ['update', 404, 'NOT_FOUND'], ['ping', 500, 'INTERNAL_ERROR']
  ]
  for (const [call, status, code] of declared) {
    stub.handle(engineError(status, code))
    const res = await calls[call]()
    t.equal(res.statusCode, status, `${call}: the engine's ${status} ${code} is declared and passes`)
    t.match(await res.body.json(), { success: false, error: { code } })
  }
  // Refused, the undeclared error is not stored under the key: the retry reaches the engine and gets its answer.
  stub.handle(engineError(400, 'INVALID_IMAGE'))
  const first = await calls.update({ 'idempotency-key': 'undeclared-code-1' })
  t.equal(first.statusCode, 502)
  await first.body.dump()
  stub.handle(contractHandler)
  const retry = await calls.update({ 'idempotency-key': 'undeclared-code-1' })
  t.equal(retry.statusCode, 200)
  t.equal(retry.headers['idempotent-replayed'], undefined)
  t.same(await retry.body.json(), { success: true, message: 'Target positions updated' })
})

t.test('Idempotency-Key at its boundaries: the schema accepts exactly what the server accepts', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const { parameters } = doc.paths['/api/portfolio/update']!['post']!
  const schema = parameters.find((p) => p.name === 'idempotency-key')!.schema
  const valid = new Ajv2020({ strict: false }).compile(schema)
  const keys: Array<[string, boolean]> = [
    ['a'.repeat(255), true],
    ['a'.repeat(256), false],
    [`"${'a'.repeat(255)}"`, true],
    [`"${'a'.repeat(256)}"`, false],
    ['"quoted"', true],
    ['"unclosed', false],
    ['in"side', true],
    ['"in"side"', false],
    ['""', false],
    ['!', true]
  ]
  let n = 0
  for (const [key, accepted] of keys) {
    // Each accepted key fresh (a number in front), so no answer is a replay.
    const fresh = `${key.startsWith('"') ? '"' : ''}${n++}${key.replace(/^"/, '')}`
    const unique = accepted && key.length < 250 ? fresh : key
    const res = await request(`${url}/api/portfolio/update`, updateRequest({ 'idempotency-key': unique }))
    await res.body.dump()
    t.equal(res.statusCode, accepted ? 200 : 400, `${unique.slice(0, 20)}... (${unique.length}): the server`)
    t.equal(valid(unique), accepted, `${unique.slice(0, 20)}... (${unique.length}): the schema`)
  }
})

t.test('x-request-id: any value is accepted; a sane one is kept, up to 128 characters', async (t) => {
  const { url } = await build(t)
  for (const [given, kept] of [['a'.repeat(128), true], ['a'.repeat(129), false], ['with space', false]] as const) {
    const res = await request(`${url}/ping`, { headers: { 'x-request-id': given } })
    t.equal(res.statusCode, 200)
    await res.body.dump()
    t.equal(res.headers['x-request-id'] === given, kept, `${given.length} characters: ${kept ? 'kept' : 'replaced'}`)
  }
})

t.test('the answer check catches an undeclared header or status, a missing header, a wrong body', async (t) => {
  const json = 'application/json; charset=utf-8'
  const headers = { 'x-request-id': 'r', 'content-type': json }
  const base = { method: 'GET', url: '/ping', headers, body: Buffer.from('{"message":"pong"}') }
  const simple = Buffer.from('{"error":"x"}')
  t.same(violationsOf({ ...base, status: 200 }), [], 'a declared answer passes')
  t.same(violationsOf({ ...base, status: 200, headers: { ...base.headers, 'x-planted': '1' } }),
    ['GET /ping 200: header x-planted is sent but not declared'])
  t.same(violationsOf({ ...base, status: 418 }), ['GET /ping answered 418, which its operation does not declare'])
  t.same(violationsOf({ ...base, status: 200, headers: { 'content-type': json } }),
    ['GET /ping 200: required header x-request-id is missing'])
  t.same(violationsOf({ ...base, status: 200, body: Buffer.from('{"message":"pang"}') }),
    ['GET /ping 200: the body {"message":"pang"} is not of its schema'])
  t.same(violationsOf({ ...base, method: 'POST', url: '/api/portfolio/update', status: 401, body: simple }),
    ['POST /api/portfolio/update 401: required header www-authenticate is missing'])
  const raw = { headers: { 'x-request-id': 'r', 'content-type': json, connection: 'close' }, body: simple }
  t.same(violationsOfRaw({ ...raw, status: 431 }), [], "a parser's answer, as every operation declares it")
  t.same(violationsOfRaw({ ...raw, status: 418 }),
    ['raw answer: GET /openapi.json answered 418, which its operation does not declare'])
  const allow = { ...base.headers, allow: 'GET, HEAD' }
  const deleted = violationsOf({ ...base, method: 'DELETE', status: 405, headers: allow, body: simple })
  t.same(deleted, [], 'a 405 as the document says')
})

t.test('an unmatched /api/* request the shedder refuses gets the 503 x-unmatched-requests declares', async (t) => {
  const { url } = await build(t, { env: { SHED_EVENT_LOOP_DELAY_MS: '100' } })
  const socket = connect(Number(new URL(url).port), '127.0.0.1')
  t.teardown(() => socket.destroy())
  await once(socket, 'connect')
  let raw = ''
  socket.setEncoding('utf8').on('data', (chunk: string) => { raw += chunk })
  const ended = once(socket, 'end')
  socket.end('GET /api/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')
  // The gateway's loop (this process's) stalls past its bound with the request in its socket: it is shed.
  const until = performance.now() + 400
  while (performance.now() < until) { /* the stall */ }
  await ended
  t.match(raw, /^HTTP\/1\.1 503 /)
  t.match(raw, /\r\nretry-after: 1\r\n/i)
  t.equal(raw.slice(raw.indexOf('\r\n\r\n') + 4), JSON.stringify({ error: 'gateway is overloaded, retry later' }))
  // build()'s check fails the test in teardown if the document does not declare it; said here as well.
  const simple = Buffer.from('{"error":"gateway is overloaded, retry later"}')
  const headers = { 'x-request-id': 'r', 'content-type': 'application/json; charset=utf-8', 'retry-after': '1' }
  t.same(violationsOf({ method: 'GET', url: '/api/nope', status: 503, headers, body: simple }), [])
})

t.test('the answer check judges an unmatched request by x-unmatched-requests alone, not by sibling operations',
  async (t) => {
    const headers = { 'x-request-id': 'r', 'content-type': 'application/json; charset=utf-8' }
    const body = Buffer.from('{"error":"x"}')
    const challenge = { ...headers, 'www-authenticate': 'Bearer' }
    t.same(violationsOf({ method: 'GET', url: '/api/nope', status: 401, headers: challenge, body }),
      ['GET /api/nope matches no operation, and 401 is not declared for such requests'])
    t.same(violationsOf({ method: 'GET', url: '/api/nope', status: 429, headers, body }),
      ['GET /api/nope matches no operation, and 429 is not declared for such requests'])
    t.same(violationsOf({ method: 'GET', url: '/api/nope', status: 503, headers, body }),
      ['GET /api/nope 503: required header retry-after is missing'])
    t.same(violationsOf({ method: 'GET', url: '/api/nope', status: 404, headers, body }), [])
    t.same(violationsOf({ method: 'GET', url: '/healthz', status: 417, headers, body }), [], "the parser's, anywhere")
  })

t.test('the answer check holds app.inject() answers to the document too: a planted header is caught', async (t) => {
  const app = Fastify()
  app.get('/ping', async (_req, reply) => await reply.header('x-request-id', 'r').header('x-planted', '1')
    .send({ message: 'pong' }))
  t.teardown(async () => await app.close())
  const violations: string[] = []
  checkInjects(app, violations)
  const res = await app.inject({ method: 'GET', url: '/ping' })
  t.equal(res.statusCode, 200)
  t.same(violations, ['GET /ping 200: header x-planted is sent but not declared'])
  t.throws(() => app.inject(), /pass options and await/, 'the chain form, which would go unchecked, is refused')
  // build() wraps its gateway's inject the same way: a declared answer passes its teardown's check.
  const gateway = await build(t)
  t.equal((await gateway.app.inject({ url: '/ping' })).statusCode, 200)
})

t.test("a forked worker's undeclared answer is read with the process the test started", async (t) => {
  const script = join(ROOT, 'dist', 'test', 'helpers', 'forking-answerer.js')
  const primary = spawn(process.execPath, ['--import', pathToFileURL(ANSWER_CHECK).href, script], {
    cwd: ROOT, env: { PATH: process.env['PATH'] ?? '' }, stdio: ['ignore', 'pipe', 'inherit']
  })
  const exited = once(primary, 'exit')
  t.teardown(() => { primary.kill('SIGKILL') })
  let out = ''
  for await (const chunk of primary.stdout) {
    out += String(chunk)
    if (out.includes('\n')) break
  }
  const port = /worker listening on (\d+)/.exec(out)![1]!
  const res = await request(`http://127.0.0.1:${port}/ping`)
  t.equal(res.statusCode, 418)
  await res.body.dump()
  await exited
  t.throws(() => assertAnswersDeclared(primary.pid), /gateway process \d+\):\nGET \/ping answered 418/)
  t.doesNotThrow(() => assertAnswersDeclared(primary.pid), 'read once, then removed')
})

t.test('Redocly\'s recommended rules: no error, no warning', async (t) => {
  const lint = [bin('@redocly', 'cli', 'bin', 'cli.js'), 'lint', '--extends=recommended', 'openapi.json']
  const { stdout, stderr } = await run(process.execPath, lint, {
    cwd: ROOT,
    // Offline: no usage report, no update check; the npm registry is all a fresh clone has had.
    env: { PATH: process.env['PATH'] ?? '', REDOCLY_TELEMETRY: 'off', REDOCLY_SUPPRESS_UPDATE_NOTICE: 'true' },
    timeout: 50_000
  })
  const output = `${stdout}${stderr}`
  t.match(output, /Woohoo! Your API description is valid/)
  t.notMatch(output, /warning|error/i, output)
})

t.test('openapi-typescript reads the document without a warning, and client/schema.ts is what it writes', async (t) => {
  const check = [bin('openapi-typescript', 'bin', 'cli.js'), 'openapi.json', '-o', 'client/schema.ts', '--check']
  const { stdout, stderr } = await run(process.execPath, check, {
    cwd: ROOT, env: { PATH: process.env['PATH'] ?? '', NO_COLOR: '1' }, timeout: 50_000
  })
  t.notMatch(`${stdout}${stderr}`, /warn|error/i, `${stdout}${stderr}`)
})
