/**
 * Tries that never started leave the queue (DECISIONS 24 v2): a try given up
 * while it waits for one of its endpoint's connections (the client gone, the
 * call's deadline, a GET's per-try timeout) ends at once, stops counting in
 * the queue that drives shedding, and never reaches a socket later, so it
 * costs no connection. The engine doubles below hold their first answers
 * (every connection busy) and count the TCP connections they accept.
 */
import { once } from 'node:events'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import t from 'tap'
import { EngineClient } from '../src/engine-client/client.js'
import { GatewayError } from '../src/http/errors.js'
import { eventually } from './helpers/engine.js'

const PING = { method: 'GET', path: '/api/portfolio/ping', requestId: 'r' } as const
const UPDATE = { method: 'POST', path: '/api/portfolio/update', requestId: 'r', contentType: 'application/json', body: '{}' } as const

/**
 * An engine double that holds its first `hold` answers until release() and
 * answers the rest at once, counting the TCP connections it accepts and the
 * requests that reach it. Its keep-alive (10 s, hinted as `timeout=10`) outlives
 * the test, so a connection closes only if the gateway closes it. (A hint
 * under undici's 2 s threshold, like the shared stub's 500 ms, makes undici
 * close every socket after one answer.)
 */
async function saturated (t: { teardown: (fn: () => unknown) => void }, hold: number) {
  const held: Array<() => void> = []
  const stats = { connections: 0, started: 0 }
  const server = createServer((req, res) => {
    stats.started++
    const answer = (): void => {
      res.writeHead(200, { 'content-type': 'text/plain; charset=utf-8', 'content-length': '4' })
      res.end('pong')
    }
    req.resume()
    if (stats.started <= hold) held.push(answer)
    else answer()
  })
  server.keepAliveTimeout = 10_000
  server.on('connection', () => { stats.connections++ })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(async () => {
    server.closeAllConnections()
    server.close()
    await once(server, 'close')
  })
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, stats, release: () => { for (const answer of held.splice(0)) answer() } }
}

const codeOf = async (call: Promise<unknown>): Promise<string> => await call.then(() => 'answered', (err: unknown) => (err as GatewayError).code ?? String(err))

t.test('tries given up in the queue (client gone, deadline) leave it at once and open no connection', async (t) => {
  const engine = await saturated(t, 2)
  const client = new EngineClient({ url: engine.url, timeoutMs: 10_000, connections: 2, maxQueue: 8, keepAliveTimeoutMs: 5_000 })
  t.teardown(() => client.close())
  // Both connections busy with a held answer.
  const busy = [client.call(PING), client.call(PING)]
  t.ok(await eventually(() => engine.stats.started === 2, 5_000), 'both connections hold a request')
  t.equal(engine.stats.connections, 2)

  // Eight tries queue (the queue's bound): four are left by their client, four reach their deadline.
  const gone = Array.from({ length: 4 }, () => new AbortController())
  const left = gone.map(async (abort) => await codeOf(client.call({ ...PING, signal: abort.signal })))
  const late = Array.from({ length: 4 }, async () => await codeOf(client.call({ ...PING, responseTimeoutMs: 150 })))
  t.equal(client.poolState().queued, 8, 'eight wait for a connection')
  t.ok(client.queueFull(), 'the queue is at its bound: a ninth would be refused')
  t.equal(await codeOf(client.call(PING)), 'OVERLOADED', 'refused with the overloaded 503 at once')

  for (const abort of gone) abort.abort(new GatewayError('VALIDATION_ERROR', 'the client left'))
  t.same(await Promise.all(left), ['VALIDATION_ERROR', 'VALIDATION_ERROR', 'VALIDATION_ERROR', 'VALIDATION_ERROR'], 'each left call ends at once with its reason')
  t.equal(client.poolState().queued, 4, 'left calls no longer count as queued')
  t.same(await Promise.all(late), ['UPSTREAM_TIMEOUT', 'UPSTREAM_TIMEOUT', 'UPSTREAM_TIMEOUT', 'UPSTREAM_TIMEOUT'], 'the others time out in the queue')
  t.equal(client.poolState().queued, 0, 'nothing counts as queued any more')
  t.notOk(client.queueFull(), 'new calls are taken again')
  const next = client.call(PING)
  t.equal(client.poolState().queued, 1, 'a live call waiting counts')

  engine.release()
  t.same((await Promise.all(busy)).map((a) => a.status), [200, 200])
  t.equal((await next).status, 200, 'the live call waiting behind the abandoned ones is answered')
  for (let i = 0; i < 6; i++) t.equal((await client.call(PING)).status, 200)
  t.equal(engine.stats.started, 2 + 1 + 6, 'no abandoned try ever reached the engine')
  t.equal(engine.stats.connections, 2, 'and none cost a connection: the two kept-alive sockets served everything')
})

t.test('a GET given up in one endpoint\'s queue by its per-try timeout is retried on the other; neither opens a connection for it', async (t) => {
  const a = await saturated(t, 1)
  const b = await saturated(t, 1)
  const client = new EngineClient({ url: [a.url, b.url], timeoutMs: 5_000, tryTimeoutMs: 200, connections: 1, keepAliveTimeoutMs: 5_000, health: { intervalMs: 0 }, random: () => 0 })
  t.teardown(() => client.close())
  // POSTs hold the connections: they have no per-try clock, only the call's 5 s.
  const busy = [client.call(UPDATE), client.call(UPDATE)]
  t.ok(await eventually(() => a.stats.started === 1 && b.stats.started === 1, 5_000), 'each endpoint\'s one connection holds a request')
  // Queued on one endpoint, given up there after 200 ms, retried on the other, given up there too: 504.
  const started = performance.now()
  t.equal(await codeOf(client.call(PING)), 'UPSTREAM_TIMEOUT')
  const ms = performance.now() - started
  t.ok(ms >= 350 && ms < 3_000, `two tries of 200 ms each, not the 5 s deadline (${ms.toFixed(0)} ms)`)
  t.equal(client.poolState().queued, 0, 'neither try still counts as queued')
  a.release()
  b.release()
  t.same((await Promise.all(busy)).map((x) => x.status), [200, 200])
  for (let i = 0; i < 4; i++) t.equal((await client.call(PING)).status, 200)
  t.equal(a.stats.started + b.stats.started, 2 + 4, 'the given-up tries never reached an engine')
  t.same([a.stats.connections, b.stats.connections], [1, 1], 'one connection each, kept alive throughout')
})
