/**
 * The engine pool's idle bound is the gateway's, whatever the engine's
 * `Keep-Alive: timeout=N` hint says: an engine that offers
 * 60 s still has its idle socket closed by the gateway after the pool's bound.
 */
import { once } from 'node:events'
import { createServer, type Server } from 'node:http'
import type { AddressInfo, Socket } from 'node:net'
import t from 'tap'
import { EngineClient } from '../../src/engine-client/client.js'

t.test('an engine hinting Keep-Alive: timeout=60 gets its idle socket closed after the pool bound', async (t) => {
  const engine: Server = createServer((_req, res) => { res.end('pong') })
  engine.keepAliveTimeout = 60_000 // Node then sends `Keep-Alive: timeout=60`
  engine.listen(0, '127.0.0.1')
  await once(engine, 'listening')
  t.teardown(() => engine.close())
  const sockets: Socket[] = []
  engine.on('connection', (socket: Socket) => sockets.push(socket))

  const client = new EngineClient({ url: `http://127.0.0.1:${(engine.address() as AddressInfo).port}`, timeoutMs: 5_000, keepAliveTimeoutMs: 300 })
  t.teardown(() => client.close())
  const answer = await client.call({ method: 'GET', path: '/api/portfolio/ping', requestId: 'r1', userId: 'u1' })
  t.equal(answer.status, 200)
  t.equal(sockets.length, 1)
  const started = Date.now()
  // The gateway closes its side; the engine sees the end. Without the cap undici keeps it ~58 s.
  const closed = once(sockets[0]!, 'close')
  const deadline = new Promise((_resolve, reject) => setTimeout(() => reject(new Error('socket still open after 20 s')), 20_000).unref())
  await Promise.race([closed, deadline])
  t.ok(Date.now() - started < 20_000, `closed after ${Date.now() - started} ms, not the engine's 60 s`)
})

t.test('the engine pool closes with the gateway that composed it', async (t) => {
  const { compose } = await import('../../src/compose.js')
  const { loadConfig } = await import('../../src/config.js')
  const config = loadConfig({ JWT_SECRET: 'x'.repeat(32), UPSTREAM_URL: 'http://127.0.0.1:9', SHED_EVENT_LOOP_DELAY_MS: '0' })
  const { engine, close } = await compose(config)
  await close()
  const call = engine.call({ method: 'GET', path: '/health', requestId: 'r', userId: 'u' })
  const err = await call.then(() => undefined, (e: unknown) => e) as { cause?: { code?: string } }
  t.match(err.cause?.code, /^UND_ERR_(CLOSED|DESTROYED)$/, 'a call after the gateway closed finds the pool closed')
})
