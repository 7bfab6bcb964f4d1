/**
 * Tries that never started leave the queue (DECISIONS 24): a try given up
 * while it waits for one of its endpoint's connections (the client gone, the
 * call's deadline, a GET's per-try timeout) ends at once, stops counting in
 * the queue that drives shedding, and never reaches a socket later, so it
 * costs no connection. The engine doubles below hold their first answers
 * (every connection busy) and count the TCP connections they accept.
 */
import { once } from 'node:events'
import { createServer } from 'node:http'
import { connect, type Socket } from 'node:net'
import type { FastifyInstance } from 'fastify'
import t, { type Test } from 'tap'
import { request } from 'undici'
import { EngineClient } from '../../src/engine-client/client.js'
import type { GatewayMetrics } from '../../src/observability/metrics.js'
import { GatewayError } from '../../src/http/errors.js'
import { bearer, build, validUpdate } from '../helpers/app.js'
import { attemptUntil, eventually } from '../helpers/engine.js'
import { CREATE_FIELDS, imagePart, multipartBody, pngOfSize } from '../helpers/multipart.js'
import { metricOf } from '../helpers/prometheus.js'
import { listenOnLoopback } from '../helpers/processes.js'

const PING = { method: 'GET', path: '/api/portfolio/ping', requestId: 'r' } as const
const UPDATE = {
  method: 'POST',
  path: '/api/portfolio/update',
  requestId: 'r',
  contentType: 'application/json',
  body: '{}'
} as const

/**
 * An engine double that holds its first `hold` answers until release() and
 * answers the rest at once, counting the TCP connections it accepts, the
 * requests that reach it, the whole request bodies it read (`bodies`), the
 * answers it finished writing and the requests whose connection the gateway
 * cut before the answer (`cut`). Its keep-alive (10 s, hinted as `timeout=10`)
 * outlives the test, so a connection closes only if the gateway closes it. (A
 * hint under undici's 2 s threshold, like the shared stub's 500 ms, makes
 * undici close every socket after one answer.)
 */
async function saturated (t: { teardown: (fn: () => unknown) => void }, hold: number) {
  const held: Array<() => void> = []
  const stats = { connections: 0, started: 0, answered: 0, cut: 0, bodies: [] as string[] }
  const server = createServer((req, res) => {
    stats.started++
    const chunks: Buffer[] = []
    let body: Promise<void> = Promise.resolve()
    const answer = (): void => {
      // An update gets the contract's answer; anything else the ping's.
      const [type, text] =
        req.url === '/api/portfolio/update'
          ? ['application/json', '{"success":true,"message":"updated"}']
          : ['text/plain; charset=utf-8', 'pong']
      void body.then(() => {
        res.writeHead(200, { 'content-type': type, 'content-length': String(Buffer.byteLength(text)) })
        res.end(text)
      })
    }
    body = new Promise((resolve) => {
      req.on('data', (c: Buffer) => chunks.push(c))
      req.on('end', () => {
        stats.bodies.push(Buffer.concat(chunks).toString())
        resolve()
      })
    })
    res.on('finish', () => {
      stats.answered++
    })
    res.on('close', () => {
      if (!res.writableFinished) stats.cut++
    })
    if (stats.started <= hold) held.push(answer)
    else answer()
  })
  server.keepAliveTimeout = 10_000
  server.on('connection', () => {
    stats.connections++
  })
  const port = await listenOnLoopback(t, server)
  return {
    url: `http://127.0.0.1:${port}`,
    endpoint: `127.0.0.1:${port}`,
    stats,
    release: () => {
      for (const answer of held.splice(0)) answer()
    }
  }
}

const codeOf = async (call: Promise<unknown>): Promise<string> =>
  await call.then(
    () => 'answered',
    (err: unknown) => (err as GatewayError).code ?? String(err)
  )

t.test('tries given up in the queue (client gone, deadline) leave it at once and open no connection', async (t) => {
  const engine = await saturated(t, 2)
  const client = new EngineClient({
    url: engine.url,
    timeoutMs: 10_000,
    connections: 2,
    maxQueue: 8,
    keepAliveTimeoutMs: 5_000
  })
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
  t.same(
    await Promise.all(left),
    ['VALIDATION_ERROR', 'VALIDATION_ERROR', 'VALIDATION_ERROR', 'VALIDATION_ERROR'],
    'each left call ends at once with its reason'
  )
  t.equal(client.poolState().queued, 4, 'left calls no longer count as queued')
  t.same(
    await Promise.all(late),
    ['UPSTREAM_TIMEOUT', 'UPSTREAM_TIMEOUT', 'UPSTREAM_TIMEOUT', 'UPSTREAM_TIMEOUT'],
    'the others time out in the queue'
  )
  t.equal(client.poolState().queued, 0, 'nothing counts as queued any more')
  t.notOk(client.queueFull(), 'new calls are taken again')
  const next = client.call(PING)
  t.equal(client.poolState().queued, 1, 'a live call waiting counts')

  engine.release()
  t.same(
    (await Promise.all(busy)).map((a) => a.status),
    [200, 200]
  )
  t.equal((await next).status, 200, 'the live call waiting behind the abandoned ones is answered')
  for (let i = 0; i < 6; i++) t.equal((await client.call(PING)).status, 200)
  t.equal(engine.stats.started, 2 + 1 + 6, 'no abandoned try ever reached the engine')
  t.equal(engine.stats.connections, 2, 'and none cost a connection: the two kept-alive sockets served everything')
})

t.test(
  "a GET given up in one endpoint's queue by its per-try timeout is retried on the other; neither opens a connection for it",
  async (t) => {
    const a = await saturated(t, 1)
    const b = await saturated(t, 1)
    const client = new EngineClient({
      url: [a.url, b.url],
      timeoutMs: 5_000,
      tryTimeoutMs: 200,
      connections: 1,
      keepAliveTimeoutMs: 5_000,
      health: { intervalMs: 0 },
      random: () => 0
    })
    t.teardown(() => client.close())
    // POSTs hold the connections: they have no per-try clock, only the call's 5 s.
    const busy = [client.call(UPDATE), client.call(UPDATE)]
    t.ok(
      await eventually(() => a.stats.started === 1 && b.stats.started === 1, 5_000),
      "each endpoint's one connection holds a request"
    )
    // Queued on one endpoint, given up there after 200 ms, retried on the other, given up there too: 504.
    const started = performance.now()
    t.equal(await codeOf(client.call(PING)), 'UPSTREAM_TIMEOUT')
    const ms = performance.now() - started
    t.ok(ms >= 350 && ms < 3_000, `two tries of 200 ms each, not the 5 s deadline (${ms.toFixed(0)} ms)`)
    t.equal(client.poolState().queued, 0, 'neither try still counts as queued')
    a.release()
    b.release()
    t.same(
      (await Promise.all(busy)).map((x) => x.status),
      [200, 200]
    )
    for (let i = 0; i < 4; i++) t.equal((await client.call(PING)).status, 200)
    t.equal(a.stats.started + b.stats.started, 2 + 4, 'the given-up tries never reached an engine')
    t.same([a.stats.connections, b.stats.connections], [1, 1], 'one connection each, kept alive throughout')
  }
)

/**
 * Through the gateway: a client whose ping, update or create waits in the
 * queue for the engine's one connection hangs up. Its call leaves the queue at
 * once (no longer counted toward shedding, never later sent), counted as
 * client_aborted. UPSTREAM_TIMEOUT_MS is long, so only the client's leaving
 * can take the call out of the queue within the test's wait.
 */
const GATEWAY = {
  env: { UPSTREAM_TIMEOUT_MS: '30000', RATE_LIMIT_PER_MINUTE: '0' },
  pool: { connections: 1 },
  engineKeepAliveMs: 10_000
} as const

/** A raw HTTP/1.1 client that sends `request` and never reads. */
async function rawClient (
  t: { teardown: (fn: () => unknown) => void },
  url: string,
  request: string | Buffer
): Promise<Socket> {
  const { hostname, port } = new URL(url)
  const socket = connect(Number(port), hostname)
  t.teardown(() => socket.destroy())
  socket.on('error', () => {})
  await once(socket, 'connect')
  socket.write(request)
  return socket
}

/** The gateway's side of each client connection, to know when it has seen a client leave. */
function serverSockets (app: FastifyInstance): Socket[] {
  const sockets: Socket[] = []
  app.server.on('connection', (s: Socket) => sockets.push(s))
  return sockets
}

const pingRequest = (): string =>
  `GET /api/portfolio/ping HTTP/1.1\r\nhost: gateway\r\nauthorization: ${bearer().authorization}\r\n\r\n`
function updateRequest (portfolioId: string): { text: string; body: string } {
  const body = JSON.stringify({ ...validUpdate(), portfolio_id: portfolioId })
  return {
    body,
    text: `POST /api/portfolio/update HTTP/1.1\r\nhost: gateway\r\nauthorization: ${bearer().authorization}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
  }
}

async function calls (
  gateway: { metrics: GatewayMetrics },
  call: string,
  outcome: string,
  endpoint: string
): Promise<number> {
  return (await metricOf(gateway.metrics, 'gateway_engine_calls_total', { call, outcome, endpoint })) ?? 0
}

t.test(
  'a ping whose client hangs up while it waits for an engine connection leaves the queue and costs no connection',
  async (t) => {
    const engine = await saturated(t, 1)
    const { metrics, engine: client, url } = await build(t, { ...GATEWAY, upstreamUrl: engine.url })
    const held = request(`${url}/api/portfolio/ping`, { headers: bearer() })
    t.ok(await eventually(() => engine.stats.started === 1, 5_000), 'the one engine connection holds a ping')

    const socket = await rawClient(t, url, pingRequest())
    t.ok(await eventually(() => client.poolState().queued === 1, 5_000), 'the second ping waits for the connection')
    socket.destroy()
    t.ok(await eventually(() => client.poolState().queued === 0, 3_000), 'gone with its client: no longer queued')
    t.notOk(client.queueFull())

    engine.release()
    t.equal((await held).statusCode, 200)
    const next = await request(`${url}/api/portfolio/ping`, { headers: bearer() })
    t.equal(next.statusCode, 200, 'a live ping after it is answered')
    await next.body.text()
    t.equal(engine.stats.started, 2, 'the abandoned ping never reached the engine')
    t.equal(engine.stats.connections, 1, 'and cost no connection: one kept-alive socket served everything')
    t.equal(engine.stats.cut, 0)
    t.equal(await calls({ metrics }, 'ping', 'client_aborted', engine.endpoint), 1, "counted as the client's")
    t.equal(await calls({ metrics }, 'ping', 'timeout', engine.endpoint), 0, 'never as the engine timing out')
    t.equal(await calls({ metrics }, 'ping', 'ok', engine.endpoint), 2)
  }
)

t.test(
  'an update whose client hangs up: left in the queue it is given up; already sent it still completes at the engine',
  async (t) => {
    const engine = await saturated(t, 1)
    const { app, metrics, engine: client, url } = await build(t, { ...GATEWAY, upstreamUrl: engine.url })
    const sockets = serverSockets(app)
    const sent = updateRequest('p-sent')
    const first = await rawClient(t, url, sent.text)
    t.ok(
      await eventually(() => engine.stats.bodies.length === 1, 5_000),
      'the first update reached the engine whole, which holds its answer'
    )
    const second = await rawClient(t, url, updateRequest('p-queued').text)
    t.ok(await eventually(() => client.poolState().queued === 1, 5_000), 'the second update waits for the connection')

    first.destroy()
    second.destroy()
    t.ok(
      await eventually(() => sockets.length === 2 && sockets.every((s) => s.destroyed), 3_000),
      'the gateway saw both clients leave'
    )
    t.ok(
      await eventually(() => client.poolState().queued === 0, 3_000),
      'the queued update is given up with its client'
    )
    t.equal(engine.stats.cut, 0, 'the update already sent was not cut off at the engine: its outcome would be unknown')

    engine.release()
    t.ok(await eventually(() => engine.stats.answered === 1, 5_000), 'the engine completed the update that was sent')
    t.ok(
      (await attemptUntil(
        async () => await calls({ metrics }, 'update', 'ok', engine.endpoint),
        (n) => n === 1,
        5_000
      )) === 1,
      'counted as answered'
    )
    t.same(engine.stats.bodies, [sent.body], 'only the update sent before its client left reached the engine')
    t.equal(
      await calls({ metrics }, 'update', 'client_aborted', engine.endpoint),
      1,
      "the queued one counted as the client's"
    )
    const next = await request(`${url}/api/portfolio/ping`, { headers: bearer() })
    t.equal(next.statusCode, 200)
    await next.body.text()
    t.equal(engine.stats.connections, 1, 'one kept-alive connection served everything')
    t.equal(engine.stats.cut, 0)
  }
)

/**
 * A create queued behind the one engine connection (held by a ping) whose client sends `sent` of its
 * form and hangs up: it leaves the queue at once, never reaches the engine and costs no connection.
 */
async function createLeavesQueue (t: Test, form: { body: Buffer; contentType: string }, sent: Buffer): Promise<void> {
  const engine = await saturated(t, 1)
  const { metrics, engine: client, url } = await build(t, { ...GATEWAY, upstreamUrl: engine.url })
  const held = request(`${url}/api/portfolio/ping`, { headers: bearer() })
  t.ok(await eventually(() => engine.stats.started === 1, 5_000), 'the one engine connection holds a ping')
  const socket = await rawClient(
    t,
    url,
    Buffer.concat([
      Buffer.from(
        `POST /api/portfolio/create HTTP/1.1\r\nhost: gateway\r\nauthorization: ${bearer().authorization}\r\ncontent-type: ${form.contentType}\r\ncontent-length: ${form.body.length}\r\n\r\n`
      ),
      sent
    ])
  )
  t.ok(await eventually(() => client.poolState().queued === 1, 5_000), 'the create waits for the connection')
  socket.destroy()
  t.ok(await eventually(() => client.poolState().queued === 0, 3_000), 'gone with its client: no longer queued')

  engine.release()
  t.equal((await held).statusCode, 200)
  const next = await request(`${url}/api/portfolio/ping`, { headers: bearer() })
  t.equal(next.statusCode, 200)
  await next.body.text()
  t.equal(engine.stats.started, 2, 'the abandoned create never reached the engine')
  t.equal(engine.stats.connections, 1, 'and cost no connection')
  t.equal(engine.stats.cut, 0)
  t.equal(await calls({ metrics }, 'create', 'client_aborted', engine.endpoint), 1, "counted as the client's")
}

t.test(
  'a create whose client hangs up after its image head while it waits for an engine connection leaves the queue',
  async (t) => {
    const form = multipartBody([...CREATE_FIELDS, imagePart(pngOfSize(2 * 1024 * 1024))])
    // The fields and the image's first 64 KiB: sniffed as a PNG, the rest waiting in the gateway's buffers to be sent.
    await createLeavesQueue(
      t,
      form,
      form.body.subarray(0, form.body.indexOf('\r\n\r\n', form.body.indexOf('filename=')) + 4 + 64 * 1024)
    )
  }
)

t.test('a whole create whose client hangs up while it waits for an engine connection leaves the queue', async (t) => {
  // The whole form, sent: the request is complete when its client leaves.
  const form = multipartBody([...CREATE_FIELDS, imagePart(pngOfSize(16 * 1024))])
  await createLeavesQueue(t, form, form.body)
})
