/**
 * /api/health against an engine that holds every request: a probe that times out keeps its socket, as a timed-out
 * ping does (docs/decisions/0033-a-slow-endpoint-gets-no-more-connections-than-it-can-hold.md), so unauthenticated
 * health requests cannot make the gateway open a connection per probe to an engine that is already slow.
 */
import { once } from 'node:events'
import { createServer, type ServerResponse } from 'node:http'
import Fastify from 'fastify'
import t from 'tap'
import { request } from 'undici'
import { EngineClient } from '../../src/engine-client/client.js'
import { engineHealthRoutes } from '../../src/routes/health.js'
import { listenOnLoopback } from '../helpers/processes.js'

const POOL = 4
// A held socket lives 3 probe times past its send: the second wave is sent well within that.
const PROBE_MS = 1_000

t.test('waves of /api/health at an engine that answers nothing: no more connections than the pool', async (t) => {
  let connections = 0
  const held: ServerResponse[] = []
  const engine = createServer((_req, res) => { held.push(res) })
  engine.on('connection', () => { connections++ })
  const port = await listenOnLoopback(t, engine)
  t.teardown(() => { for (const res of held) res.destroy() })
  const client = new EngineClient({
    url: `http://127.0.0.1:${port}`,
    timeoutMs: 10_000,
    connections: POOL,
    keepAliveTimeoutMs: 20_000,
    health: { intervalMs: 0 }
  })
  t.teardown(() => client.close())
  const app = Fastify()
  await app.register(engineHealthRoutes, { prefix: '/api', engine: client, probeTimeoutMs: PROBE_MS })
  const url = await app.listen({ host: '127.0.0.1', port: 0 })
  t.teardown(() => app.close())

  for (let wave = 1; wave <= 2; wave++) {
    const answers = await Promise.all(Array.from({ length: POOL }, async () => {
      const res = await request(`${url}/api/health`)
      return { status: res.statusCode, body: await res.body.json() as { services: unknown } }
    }))
    t.same(answers.map((a) => [a.status, a.body.services]), Array(POOL).fill(
      [200, { database: 'disconnected', cache: 'disconnected' }]
    ), `wave ${wave}: every probe timed out and said so`)
  }
  // A connection of the test's own, accepted last: every connection the gateway made before it has been counted.
  const { connect } = await import('node:net')
  const seen = once(engine, 'connection')
  const barrier = connect(port, '127.0.0.1')
  barrier.on('error', () => {})
  await seen
  barrier.destroy()
  t.equal(connections - 1, POOL, `two waves of ${POOL} timed-out probes used the pool's ${POOL} connections`)
})
