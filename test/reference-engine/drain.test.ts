/**
 * The reference engine drains (DECISIONS 25): on SIGTERM the
 * standalone process answers /health 500 and every answer with
 * `connection: close` for the notice, then stops accepting, finishes the
 * requests in flight and exits 0. Real processes from dist/, real sockets;
 * each step waits on the engine's own log lines, never on a sleep.
 */
import { once } from 'node:events'
import { readFileSync } from 'node:fs'
import { connect } from 'node:net'
import { Readable } from 'node:stream'
import t, { type Test } from 'tap'
import { Agent, Client, request } from 'undici'
import { PNG_IMAGE } from '../../fixtures/images.js'
import { USER, startEngine } from '../helpers/engine.js'
import { startEngineProcess } from '../helpers/engine-process.js'
import { multipartBody } from '../helpers/multipart.js'
import { ensureBuilt } from '../helpers/processes.js'

t.before(ensureBuilt)

const DRAINING_BODY = '{"status":"error","message":"shutting down"}'

/** A connection attempt's outcome: 'connected' or the error code. */
async function tryConnect (port: number): Promise<string> {
  const socket = connect(port, '127.0.0.1')
  try {
    await once(socket, 'connect')
    return 'connected'
  } catch (err) {
    return (err as NodeJS.ErrnoException).code ?? 'error'
  } finally {
    socket.destroy()
  }
}

/** A create whose body stops `held` bytes before its end, until `release()`: a slow upload in flight. */
function slowCreate () {
  const image = Buffer.concat([readFileSync(PNG_IMAGE), Buffer.alloc(256 * 1024)])
  const { body, contentType } = multipartBody([
    { name: 'name', value: 'Slow upload' },
    { name: 'type', value: 'PORTFOLIO' },
    { name: 'image', filename: 'a.png', contentType: 'image/png', data: image }
  ])
  // The last 1,000 bytes are image padding, the part's CRLF and the closing boundary.
  const split = body.length - 1_000
  let release: () => void = () => {}
  const released = new Promise<void>((resolve) => { release = resolve })
  async function * chunks (): AsyncGenerator<Buffer> {
    yield body.subarray(0, split)
    await released
    yield body.subarray(split)
  }
  return { body: Readable.from(chunks()), length: body.length, contentType, release }
}

/** A create the engine has begun to receive, whose upload waits for `slow.release()`. */
async function createInFlight (t: Test, engine: { url: string, waitFor: (pattern: RegExp) => Promise<unknown> }): Promise<{ slow: ReturnType<typeof slowCreate>, created: ReturnType<Client['request']> }> {
  const slow = slowCreate()
  const uploader = new Client(engine.url)
  t.teardown(() => uploader.destroy())
  const created = uploader.request({
    method: 'POST',
    path: '/api/portfolio/create',
    headers: { 'x-user-id': USER, 'content-type': slow.contentType, 'content-length': String(slow.length) },
    body: slow.body
  })
  await engine.waitFor(/"url":"\/api\/portfolio\/create"/)
  return { slow, created }
}

t.test('SIGTERM: /health 500 and connection: close for the notice, then no new connections, in-flight requests finish, exit 0', async (t) => {
  const engine = await startEngineProcess(t, { ENGINE_DRAIN_NOTICE_MS: '4000' })
  t.match(engine.out(), /"drainNoticeMs":4000/, 'the override is read')

  // One kept-alive connection, opened and used before the signal.
  const kept = new Client(engine.url, { keepAliveTimeout: 60_000, keepAliveMaxTimeout: 60_000 })
  t.teardown(() => kept.destroy())
  const before = await kept.request({ method: 'GET', path: '/api/portfolio/ping', headers: { 'x-user-id': USER } })
  t.equal(before.statusCode, 200)
  t.equal(before.headers['connection'], 'keep-alive')
  await before.body.dump()

  // A create whose upload is still arriving when the signal comes.
  const { slow, created } = await createInFlight(t, engine)

  engine.proc.kill('SIGTERM')
  await engine.waitFor(/draining/)

  const during = await kept.request({ method: 'GET', path: '/api/portfolio/ping', headers: { 'x-user-id': USER } })
  t.equal(during.statusCode, 200, 'a request on the kept-alive connection is answered')
  t.equal(during.headers['connection'], 'close', '...and told that the connection ends')
  t.equal(await during.body.text(), 'pong')

  const fresh = new Agent()
  t.teardown(() => fresh.destroy())
  const health = await request(`${engine.url}/health`, { dispatcher: fresh })
  t.equal(health.statusCode, 500, '/health says 500 while draining')
  t.equal(health.headers['content-type'], 'application/json; charset=utf-8')
  t.equal(health.headers['connection'], 'close')
  t.equal(await health.body.text(), DRAINING_BODY, 'the health error shape, as the gateway answers')

  await engine.waitFor(/stopped accepting connections/)
  t.equal(await tryConnect(engine.port), 'ECONNREFUSED', 'after the notice a new connection is refused')
  t.equal(engine.proc.exitCode, null, 'the engine waits for the upload in flight')

  slow.release()
  const answer = await created
  t.equal(answer.statusCode, 200, 'the upload in flight finishes')
  t.equal(answer.headers['connection'], 'close')
  t.match(await answer.body.json(), { portfolio_id: /^[0-9a-f-]{36}$/ })

  t.same(await engine.exited, [0, null], 'the engine exits 0')
  const out = engine.out()
  const order = ['draining', 'stopped accepting connections', '"msg":"closed"'].map((line) => out.indexOf(line))
  t.ok(order.every((at, i) => at >= 0 && (i === 0 || at > order[i - 1]!)), `notice, listener closed, closed, in that order: ${order.join(' < ')}`)
})

t.test('without a notice (development) SIGTERM still lets a request in flight finish, then exits 0', async (t) => {
  const engine = await startEngineProcess(t, { NODE_ENV: 'development' })
  t.match(engine.out(), /"drainNoticeMs":0/, 'development default: no notice')
  const { slow, created } = await createInFlight(t, engine)
  engine.proc.kill('SIGTERM')
  await engine.waitFor(/stopped accepting connections/)
  t.equal(await tryConnect(engine.port), 'ECONNREFUSED')
  slow.release()
  const answer = await created
  t.equal(answer.statusCode, 200)
  t.match(await answer.body.json(), { portfolio_id: /^[0-9a-f-]{36}$/ })
  t.same(await engine.exited, [0, null])
})

t.test('embedded (buildEngine): a lifecycle that drains turns /health to 500 and closes each connection', async (t) => {
  const lifecycle = { draining: false }
  const { call, origin } = await startEngine(t, { lifecycle })
  t.equal((await call('/health')).status, 200)
  lifecycle.draining = true
  const health = await request(`${origin}/health`)
  t.equal(health.statusCode, 500)
  t.equal(health.headers['connection'], 'close')
  t.equal(await health.body.text(), DRAINING_BODY)
  const ping = await request(`${origin}/api/portfolio/ping`, { headers: { 'x-user-id': USER } })
  t.equal(ping.statusCode, 200)
  t.equal(ping.headers['connection'], 'close')
  await ping.body.dump()
})

t.test('embedded without a lifecycle (the gateway\'s `npm start`): never draining, connections kept', async (t) => {
  const { origin } = await startEngine(t)
  const ping = await request(`${origin}/api/portfolio/ping`, { headers: { 'x-user-id': USER } })
  t.equal(ping.statusCode, 200)
  t.equal(ping.headers['connection'], 'keep-alive')
  await ping.body.dump()
})
