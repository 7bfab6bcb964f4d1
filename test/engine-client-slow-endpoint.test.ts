/**
 * DECISIONS 33: an endpoint whose tries time out gets no more connections
 * than its pool holds. An engine double holds every request it gets (it
 * never answers) and counts the TCP connections it accepts; the gateway's
 * engine client, with a pool of 128, sends 400 pings at once. Each try that
 * times out on a socket destroys it (HTTP/1.1 cannot take a request back),
 * and the calls waiting behind must not get fresh sockets to the same slow
 * engine, nor may a call whose deadline passed while it waited open one.
 * Then the engine recovers, and the client serves normally again.
 */
import { createServer, type ServerResponse } from 'node:http'
import t from 'tap'
import { EngineClient } from '../src/engine-client/client.js'
import type { GatewayError } from '../src/http/errors.js'
import { listenOnLoopback } from './helpers/processes.js'

const PING = { method: 'GET', path: '/api/portfolio/ping', requestId: 'r' } as const
const POOL = 128
const CALLS = 400
const TIMEOUT_MS = 400

/** An engine that holds every request while `slow`, and answers at once otherwise; it counts what it accepts. */
async function slowEngine (t: { teardown: (fn: () => unknown) => void }) {
  const stats = { connections: 0, requests: 0 }
  const held: ServerResponse[] = []
  const state = { slow: true }
  const pong = (res: ServerResponse): void => {
    res.writeHead(200, { 'content-type': 'text/plain; charset=utf-8', 'content-length': '4' })
    res.end('pong')
  }
  const server = createServer((_req, res) => {
    stats.requests++
    if (state.slow) held.push(res)
    else pong(res)
  })
  server.keepAliveTimeout = 10_000
  server.on('connection', () => { stats.connections++ })
  const port = await listenOnLoopback(t, server)
  t.teardown(() => { for (const res of held) res.destroy() })
  const recover = (): void => {
    state.slow = false
    for (const res of held.splice(0)) res.destroy()
  }
  return { url: `http://127.0.0.1:${port}`, stats, recover }
}

const codeOf = async (call: Promise<unknown>): Promise<string> =>
  await call.then(() => 'answered', (err: unknown) => (err as GatewayError).code ?? String(err))

t.test('400 pings, a pool of 128, an engine that holds them all: it sees at most 128 connections', async (t) => {
  const engine = await slowEngine(t)
  const client = new EngineClient({
    url: engine.url,
    timeoutMs: TIMEOUT_MS,
    connections: POOL,
    maxQueue: 1_000,
    keepAliveTimeoutMs: 5_000,
    health: { intervalMs: 0 }
  })
  t.teardown(() => client.close())
  const codes = await Promise.all(Array.from({ length: CALLS }, async () => await codeOf(client.call(PING))))
  t.same([...new Set(codes)], ['UPSTREAM_TIMEOUT'], 'every call timed out')
  const { stats } = engine
  t.comment(`one wave: the engine accepted ${stats.connections} connections and got ${stats.requests} requests`)
  t.ok(stats.connections <= POOL, `the engine accepted ${stats.connections} connections, at most the pool of ${POOL}`)
  t.ok(engine.stats.requests <= POOL, `and got ${engine.stats.requests} requests: no call past its deadline was sent`)
  // A second wave while the engine is still slow: the sockets the first wave lost are not replaced, but
  // one try per timeout period probes the engine.
  const again = await Promise.all(Array.from({ length: CALLS }, async () => await codeOf(client.call(PING))))
  t.same([...new Set(again)], ['UPSTREAM_TIMEOUT'], 'a second wave times out too')
  t.comment(`two waves: the engine accepted ${stats.connections} connections and got ${stats.requests} requests`)
  t.ok(stats.connections <= POOL + 2, `after a second wave, ${stats.connections} connections: one more per period`)
  t.ok(engine.stats.requests <= POOL + 2, `and ${engine.stats.requests} requests: the probes`)

  // The engine recovers: the next probe finds it, within one timeout period.
  engine.recover()
  const from = performance.now()
  // One ping after another until one is answered: the first ones wait for the probe.
  while (await codeOf(client.call(PING)) !== 'answered' && performance.now() - from < 10 * TIMEOUT_MS);
  const recoveredMs = performance.now() - from
  t.comment(`a ping answered again ${recoveredMs.toFixed(0)} ms after the engine recovered`)
  t.ok(recoveredMs < 3 * TIMEOUT_MS, `answered ${recoveredMs.toFixed(0)} ms after the recovery`)
  // Held places come back with the answers: bursts of a pool's worth until one is answered whole (a loaded
  // runner may time some out: the bound is generous, the figure is in the comment).
  let bursts = 0
  let whole = false
  while (!whole && performance.now() - from < 50 * TIMEOUT_MS) {
    bursts++
    const codes = await Promise.all(Array.from({ length: POOL }, async () => await codeOf(client.call(PING))))
    whole = codes.every((code) => code === 'answered')
  }
  const normalMs = performance.now() - from
  t.comment(`a burst of ${POOL} answered whole ${normalMs.toFixed(0)} ms after the engine recovered (burst ${bursts})`)
  t.ok(whole, `a burst of ${POOL} is answered whole again, ${normalMs.toFixed(0)} ms after the recovery`)
})
