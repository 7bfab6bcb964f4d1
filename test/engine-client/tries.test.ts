/**
 * The engine client's tries as others see them, over real sockets: a single
 * endpoint's GET retried on a fresh connection after a keep-alive reset
 * (DECISIONS 24), the per-try observer a tracer plugs in, and status(), the
 * cluster's state for GET /status.
 */
import { createServer, type IncomingMessage } from 'node:http'
import type { Socket } from 'node:net'
import t from 'tap'
import { request } from 'undici'
import { contractHandler, json, refusedPort, startStubUpstream, type StubHandler } from '../../fixtures/stub-upstream.js'
import { EngineClient, type EngineTryInfo } from '../../src/engine-client/client.js'
import type { EngineOutcome } from '../../src/observability/metrics.js'
import { bearer, build } from '../helpers/app.js'
import { parseExposition, valueOf } from '../helpers/prometheus.js'
import { listenOnLoopback } from '../helpers/processes.js'

const PING = { method: 'GET', path: '/api/portfolio/ping', requestId: 'r' } as const
const sick503: StubHandler = (_req, res) => json(res, 503, { success: false, error: { source: 'engine', code: 'UNAVAILABLE', message: 'overloaded', function: 'any' } })

t.test('a single engine that resets a kept-alive socket: the ping is retried on a fresh connection and answered 200', async (t) => {
  // Each connection serves one request, keeps alive (a 10 s hint, so undici reuses it), and resets on the second.
  let connections = 0
  let resets = 0
  const served = new WeakMap<Socket, number>()
  const engine = createServer((req: IncomingMessage, res) => {
    const socket = req.socket
    const n = (served.get(socket) ?? 0) + 1
    served.set(socket, n)
    if (n > 1) {
      resets++
      socket.resetAndDestroy()
      return
    }
    res.writeHead(200, { 'content-type': 'text/plain; charset=utf-8', 'content-length': '4' })
    res.end('pong')
  })
  engine.keepAliveTimeout = 10_000
  engine.on('connection', () => { connections++ })
  const { metrics, url } = await build(t, { upstreamUrl: `http://127.0.0.1:${await listenOnLoopback(t, engine)}`, engineKeepAliveMs: 5_000 })
  for (let i = 0; i < 4; i++) {
    const res = await request(`${url}/api/portfolio/ping`, { headers: bearer() })
    t.equal(res.statusCode, 200, `ping ${i + 1}`)
    t.equal(await res.body.text(), 'pong')
  }
  t.equal(resets, 2, 'pings 2 and 4 each met a kept-alive socket that the engine reset')
  t.equal(connections, 4, 'each reset was followed by one fresh connection (ping 3 needed one too: the reset socket was gone)')
  const samples = parseExposition((await metrics.scrape()).body)
  t.equal(valueOf(samples, 'gateway_engine_retries_total', { call: 'ping', reason: 'reset' }), 2)
})

t.test('the per-try observer: each try starts with its endpoint, number and reason, sends its own traceparent and ends once', async (t) => {
  const a = await startStubUpstream(sick503)
  const b = await startStubUpstream()
  t.teardown(a.close)
  t.teardown(b.close)
  const client = new EngineClient({ url: [a.url, b.url], timeoutMs: 5_000, health: { intervalMs: 0 }, random: () => 0 })
  t.teardown(() => client.close())
  const parent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'

  // No observer: the request's own traceparent goes to the engine.
  t.equal((await client.call({ ...PING, traceparent: parent })).status, 200)
  t.same([...a.requests, ...b.requests].map((r) => r.headers.traceparent), [parent, parent], 'both tries carried the request\'s traceparent')

  const started: Array<Omit<EngineTryInfo, 'request'> & { traceparent: string | undefined }> = []
  const ended: Array<[EngineOutcome, number | undefined]> = []
  client.observeTries({
    startTry: (info) => {
      const { request: req, ...rest } = info
      started.push({ ...rest, traceparent: req.traceparent })
      return { traceparent: `00-0af7651916cd43dd8448eb211c80319c-00000000000000${String(info.attempt).padStart(2, '0')}-01`, end: (outcome, status) => { ended.push([outcome, status]) } }
    }
  })
  const answer = await client.call({ ...PING, traceparent: parent })
  t.equal(answer.status, 200)
  t.equal(answer.body.toString(), 'pong')
  t.same(started, [
    { call: 'ping', endpoint: `127.0.0.1:${a.port}`, attempt: 1, retryReason: undefined, traceparent: parent },
    { call: 'ping', endpoint: `127.0.0.1:${b.port}`, attempt: 2, retryReason: 'bad_response', traceparent: parent }
  ], 'the first try on the engine drawn first, the retry on the other with its reason')
  t.same(ended, [['engine_error', 503], ['ok', 200]], 'each try ended once, with its own outcome and status')
  t.equal(a.requests.at(-1)!.headers.traceparent, '00-0af7651916cd43dd8448eb211c80319c-0000000000000001-01', 'the first engine got the first try\'s context')
  t.equal(b.requests.at(-1)!.headers.traceparent, '00-0af7651916cd43dd8448eb211c80319c-0000000000000002-01', 'the second engine got the retry\'s context')

  // A try that cannot reach an engine ends once too, with the failure's outcome.
  await a.close()
  started.length = 0
  ended.length = 0
  t.equal((await client.call(PING)).status, 200)
  t.same(started.map((s) => [s.attempt, s.retryReason]), [[1, undefined], [2, 'unreachable']])
  t.same(ended, [['unavailable', undefined], ['ok', 200]])
})

t.test('status(): each endpoint\'s name, state, ejection and load, and the retry budget', async (t) => {
  let draining = false
  const a = await startStubUpstream(sick503)
  const b = await startStubUpstream((req, res, body) => {
    if (req.url === '/health' && draining) return json(res, 500, { status: 'draining' })
    contractHandler(req, res, body)
  })
  t.teardown(a.close)
  t.teardown(b.close)
  const gone = await refusedPort()
  const client = new EngineClient({
    url: [`http://engine-a.test:${a.port}`, b.url, `http://127.0.0.1:${gone}`],
    lookup: async () => [{ address: '127.0.0.1', family: 4 }],
    timeoutMs: 5_000,
    health: { intervalMs: 0 },
    random: () => 0
  })
  t.teardown(() => client.close())
  await client.ready()
  const fresh = client.status()
  t.same(fresh, {
    endpoints: [
      { endpoint: `127.0.0.1:${a.port}`, name: 'engine-a.test', state: 'up', ejectedUntil: null, ejections: 0, inFlight: 0 },
      { endpoint: `127.0.0.1:${b.port}`, name: '127.0.0.1', state: 'up', ejectedUntil: null, ejections: 0, inFlight: 0 },
      { endpoint: `127.0.0.1:${gone}`, name: '127.0.0.1', state: 'up', ejectedUntil: null, ejections: 0, inFlight: 0 }
    ],
    retryBudget: { retriesInFlight: 0, callsInFlight: 0, allowed: 3 }
  })

  // Five 503s eject the first engine; every ping is answered by the second.
  const before = Date.now()
  for (let i = 0; i < 5; i++) t.equal((await client.call(PING)).status, 200)
  draining = true
  await client.checkHealth()
  await client.checkHealth()
  const { endpoints } = client.status()
  t.match(endpoints[0], { state: 'ejected', ejections: 1, inFlight: 0 })
  const until = Date.parse(endpoints[0]!.ejectedUntil!)
  t.ok(until >= before + 30_000 && until <= Date.now() + 30_000, `ejected for the base 30 s: until ${endpoints[0]!.ejectedUntil}`)
  t.match(endpoints[1], { state: 'draining', ejectedUntil: null, ejections: 0 }, 'its /health says 500: draining')
  t.match(endpoints[2], { state: 'unreachable', ejectedUntil: null, ejections: 0 }, 'two failed checks: out of rotation')

  // In flight: a call waiting on the engine counts on its endpoint and in the budget.
  const hold = await startStubUpstream(() => {})
  t.teardown(hold.close)
  const one = new EngineClient({ url: hold.url, timeoutMs: 5_000 })
  t.teardown(() => one.close())
  const abort = new AbortController()
  const pending = one.call({ ...PING, signal: abort.signal }).catch(() => undefined)
  t.match(one.status(), { endpoints: [{ state: 'up', inFlight: 1 }], retryBudget: { retriesInFlight: 0, callsInFlight: 1, allowed: 3 } })
  abort.abort(new Error('the test is done'))
  await pending
  t.match(one.status(), { endpoints: [{ inFlight: 0 }], retryBudget: { callsInFlight: 0 } })
})
