/**
 * /api/health's probe is shared: requests that arrive while a probe is out wait for it, so a burst of health
 * requests costs the engine one request and the pool one connection, whether the engine answers or hangs.
 */
import { once } from 'node:events'
import { createServer, type ServerResponse } from 'node:http'
import { connect } from 'node:net'
import Fastify from 'fastify'
import t, { type Test } from 'tap'
import { request } from 'undici'
import { EngineClient } from '../../src/engine-client/client.js'
import { engineHealthRoutes } from '../../src/routes/health.js'
import { eventually } from '../helpers/engine.js'
import { listenOnLoopback } from '../helpers/processes.js'

const BURST = 20

/** An engine that holds every /health, counting requests and connections; `answer` answers those held. */
async function heldEngine (t: Test) {
  const stats = { connections: 0, requests: 0 }
  const held: ServerResponse[] = []
  const engine = createServer((_req, res) => {
    stats.requests++
    held.push(res)
  })
  engine.on('connection', () => { stats.connections++ })
  const port = await listenOnLoopback(t, engine)
  t.teardown(() => { for (const res of held) res.destroy() })
  return {
    port,
    stats,
    answer: () => {
      for (const res of held.splice(0)) {
        res.writeHead(200, { 'content-type': 'application/json' })
        res.end(JSON.stringify({ status: 'ok', services: { database: 'connected', cache: 'connected' } }))
      }
    },
    /** Accept a connection of the test's own: every connection made before it has been counted. */
    settled: async (): Promise<number> => {
      const seen = once(engine, 'connection')
      const socket = connect(port, '127.0.0.1')
      socket.on('error', () => {})
      await seen
      socket.destroy()
      return --stats.connections
    }
  }
}

/** The health routes alone in front of `port`, counting the health requests that reached them. */
async function gateway (t: Test, port: number, probeTimeoutMs: number) {
  const client = new EngineClient({
    url: `http://127.0.0.1:${port}`,
    timeoutMs: 10_000,
    connections: 4,
    keepAliveTimeoutMs: 20_000,
    health: { intervalMs: 0 }
  })
  t.teardown(() => client.close())
  const app = Fastify()
  const arrived = { count: 0 }
  app.addHook('onRequest', async () => { arrived.count++ })
  await app.register(engineHealthRoutes, { prefix: '/api', engine: client, probeTimeoutMs })
  const url = await app.listen({ host: '127.0.0.1', port: 0 })
  t.teardown(() => app.close())
  return { url, arrived }
}

async function burst (url: string): Promise<Array<Promise<[number, unknown]>>> {
  return Array.from({ length: BURST }, async (): Promise<[number, unknown]> => {
    const res = await request(`${url}/api/health`)
    const body = await res.body.json() as { services: unknown }
    return [res.statusCode, body.services]
  })
}

t.test('a burst of /api/health while the probe is out: one engine request, every answer from it', async (t) => {
  const engine = await heldEngine(t)
  const { url, arrived } = await gateway(t, engine.port, 10_000)
  const answers = await burst(url)
  t.ok(await eventually(() => arrived.count === BURST, 10_000), `all ${BURST} requests reached the gateway`)
  t.equal(engine.stats.requests, 1, 'the engine got one probe')
  engine.answer()
  t.same(await Promise.all(answers), Array(BURST).fill([200, { database: 'connected', cache: 'connected' }]),
    'each answer carries what the engine said')
  t.equal(await engine.settled(), 1, 'on one connection')
})

t.test('bursts of /api/health at an engine that answers nothing: one probe and one connection a burst', async (t) => {
  const engine = await heldEngine(t)
  const { url } = await gateway(t, engine.port, 300)
  for (let round = 1; round <= 3; round++) {
    t.same(await Promise.all(await burst(url)), Array(BURST).fill([200, { database: 'disconnected', cache: 'disconnected' }]),
      `burst ${round}: every request said the engine could not be reached`)
  }
  t.equal(engine.stats.requests, 3, 'the engine got one probe a burst')
  t.ok(await engine.settled() <= 3, 'and at most one connection a burst')
})
