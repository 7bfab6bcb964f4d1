/**
 * GATEWAY_WORKERS=N (DECISIONS 35, "Workers") as real processes on a real
 * port: the refusal without Redis, two workers answering on one port, each
 * with its own metrics listener, and SIGTERM draining both.
 */
import { once } from 'node:events'
import { createServer } from 'node:net'
import type { ServerResponse } from 'node:http'
import t, { type Test } from 'tap'
import { request } from 'undici'
import { contractHandler, startStubUpstream, type StubUpstream } from '../fixtures/stub-upstream.js'
import { isAlive } from '../deploy/local/parts.js'
import { bearer, SECRET } from './helpers/app.js'
import { client, exitOf, lines, SERVER, start, WAIT_MS, type Child } from './helpers/gateway-process.js'
import { parseExposition, valueOf } from './helpers/prometheus.js'
import { ensureBuilt, freePort } from './helpers/processes.js'
import { requireRedis, startRedis } from './helpers/redis.js'
import { attemptUntil } from './helpers/until.js'

// Three groups of two gateway processes each, started and drained in turn.
t.setTimeout(120_000)

t.before(ensureBuilt)

/** Two gateway start-ups one after the other, on a machine that may be running other test files. */
const START_MS = 45_000

/** A free port whose next port is free too: worker 1 serves metrics on METRICS_PORT + 1. */
async function twoFreePorts (): Promise<number> {
  for (;;) {
    const port = await freePort()
    const next = createServer().listen(port + 1, '127.0.0.1')
    const bound = await new Promise<boolean>((resolve) => {
      next.once('listening', () => resolve(true))
      next.once('error', () => resolve(false))
    })
    if (bound) {
      next.close()
      await once(next, 'close')
      return port
    }
  }
}

interface Entry { msg?: string, pid?: number, url?: string, status?: number, worker?: number }
const entries = (child: Child): Entry[] =>
  lines(child.out()).filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Entry)
const pings = (child: Child): Entry[] =>
  entries(child).filter((e) => e.msg === 'request' && e.url?.startsWith('/api/portfolio/ping?n=') === true)

/** Two workers on a free port in front of `stub`, with Redis; resolves once both said "gateway ready". */
async function startWorkers (t: Test, stub: StubUpstream, metricsPort = 0): Promise<{ child: Child, url: string }> {
  const redis = await startRedis(t)
  const port = await freePort()
  const child = start(t, SERVER, {
    GATEWAY_WORKERS: '2',
    PORT: String(port),
    HOST: '127.0.0.1',
    LOG_LEVEL: 'info',
    JWT_SECRET: SECRET,
    UPSTREAM_URL: stub.url,
    REDIS_URL: redis.url,
    METRICS_PORT: String(metricsPort),
    // Not under test, and a busy machine's event loop delay would shed some of the requests these tests count.
    SHED_EVENT_LOOP_DELAY_MS: '0'
  })
  // The copy starts only once worker 0 is ready: two start-ups in turn, slow on a busy machine.
  const readyLines = async (): Promise<Entry[]> => entries(child).filter((e) => e.msg === 'gateway ready')
  const ready = await attemptUntil(readyLines, (list) => list.length >= 2 || child.proc.exitCode !== null, START_MS)
  if (ready.length < 2) throw new Error(`not both workers ready within ${START_MS} ms:\n${child.out()}\n${child.err()}`)
  // The copy is detached: teardown ends it too if a test failed before it drained.
  t.teardown(() => {
    for (const { pid } of entries(child)) {
      if (pid !== undefined && pid !== child.proc.pid && isAlive(pid)) process.kill(pid, 'SIGKILL')
    }
  })
  return { child, url: `http://127.0.0.1:${port}` }
}

t.test('more than one worker without Redis is refused at start with one line', async (t) => {
  const port = String(await freePort())
  const env = {
    GATEWAY_WORKERS: '2',
    PORT: port,
    HOST: '127.0.0.1',
    JWT_SECRET: SECRET,
    UPSTREAM_URL: 'http://127.0.0.1:9'
  }
  const child = start(t, SERVER, env)
  t.same(await exitOf(child), { code: 1, signal: null })
  t.same(lines(child.err()), [
    'portfolio-gateway: GATEWAY_WORKERS=2 needs Redis: ' +
    'each worker would keep rate limits and idempotency records of its own; ' +
    'set REDIS_URL (or REDIS_SENTINELS with REDIS_SENTINEL_NAME, or REDIS_CLUSTER_NODES), or GATEWAY_WORKERS=1'
  ])
  t.notMatch(child.out(), /gateway ready/, 'it never served')
})

t.test('two workers on one port', async (t) => {
  if (!requireRedis(t)) return
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const metricsPort = await twoFreePorts()
  const { child, url } = await startWorkers(t, stub, metricsPort)
  const ready = entries(child).filter((e) => e.msg === 'gateway ready')
  t.same(ready.map((e) => e.worker).sort(), [0, 1])
  t.equal(ready.find((e) => e.worker === 0)?.pid, child.proc.pid, 'worker 0 is the process that was started')
  const copy = ready.find((e) => e.worker === 1)!.pid!

  // Each request on a connection of its own: the kernel picks a worker per connection.
  const N = 40
  const dispatcher = client(t)
  const answers = await Promise.all(Array.from({ length: N }, async (_, i) => {
    const res = await request(`${url}/api/portfolio/ping?n=${i}`, { dispatcher, headers: bearer(), reset: true })
    return [res.statusCode, await res.body.text()]
  }))
  t.same(answers, Array.from({ length: N }, () => [200, 'pong']), 'every request answered')
  // Access lines leave in batches (and at the latest every 250 ms): wait for all of them.
  const access = await attemptUntil(async () => pings(child), (list) => list.length >= N, WAIT_MS)
  const byPid = new Map<number, number>()
  for (const e of access) byPid.set(e.pid!, (byPid.get(e.pid!) ?? 0) + 1)

  t.test('both workers answer requests on the shared port', async (t) => {
    t.equal(access.length, N, 'one access line per request')
    t.same([...byPid.keys()].sort(), [child.proc.pid, copy].sort(), 'answered by both processes')
  })

  t.test('each worker serves its own metrics on METRICS_PORT + its index, labelled with it', async (t) => {
    for (const [worker, pid] of [[0, child.proc.pid!], [1, copy]] as const) {
      const scraped = await request(`http://127.0.0.1:${metricsPort + worker}/metrics`, { dispatcher })
      t.equal(scraped.statusCode, 200)
      const samples = parseExposition(await scraped.body.text())
      const labels = { route: '/api/portfolio/ping', method: 'GET', status_class: '2xx', worker: String(worker) }
      const counted = valueOf(samples, 'gateway_requests_total', labels)
      t.equal(counted, byPid.get(pid), `worker ${worker} counts what its access lines show`)
    }
  })
})

t.test('SIGTERM drains both workers: requests in flight on each are answered, then both exit', async (t) => {
  if (!requireRedis(t)) return
  const N = 16
  const held: ServerResponse[] = []
  let allHeld: () => void = () => {}
  const arrived = new Promise<void>((resolve) => { allHeld = resolve })
  const stub = await startStubUpstream((req, res, body) => {
    if (req.url !== '/api/portfolio/ping') return contractHandler(req, res, body)
    held.push(res)
    if (held.length === N) allHeld()
  })
  t.teardown(stub.close)
  const { child, url } = await startWorkers(t, stub)
  const copy = entries(child).find((e) => e.msg === 'gateway ready' && e.worker === 1)!.pid!
  const dispatcher = client(t)
  const answers = Promise.all(Array.from({ length: N }, async (_, i) => {
    const res = await request(`${url}/api/portfolio/ping?n=${i}`, { dispatcher, headers: bearer(), reset: true })
    return [res.statusCode, await res.body.text()]
  }))
  await arrived

  child.proc.kill('SIGTERM')
  await child.waitForOutput(/"msg":"draining[^\n]*\n(?:.*\n)*.*"msg":"draining/)
  for (const res of held) {
    res.writeHead(200, { 'content-type': 'text/plain; charset=utf-8' })
    res.end('pong')
  }
  t.same(await answers, Array.from({ length: N }, () => [200, 'pong']), 'every request in flight answered')
  t.same(await exitOf(child), { code: 0, signal: null }, 'worker 0 exits 0 once both have closed')
  t.notOk(isAlive(copy), 'the copy is gone')
  const all = entries(child)
  const closed = all.filter((e) => e.msg === 'closed').map((e) => e.pid)
  t.same(closed.sort(), [child.proc.pid, copy].sort(), 'each closed by its own graceful close')
  const pids = new Set(pings(child).map((e) => e.pid))
  t.same([...pids].sort(), [child.proc.pid, copy].sort(), 'both workers had requests in flight')
})

t.test('a worker that dies unasked drains the other, and worker 0 exits 1', async (t) => {
  if (!requireRedis(t)) return
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { child } = await startWorkers(t, stub)
  const copy = entries(child).find((e) => e.msg === 'gateway ready' && e.worker === 1)!.pid!
  process.kill(copy, 'SIGKILL')
  t.same(await exitOf(child), { code: 1, signal: null })
  t.match(child.out(), /"worker":1,"code":null,"signal":"SIGKILL","msg":"a worker exited: draining every worker"/)
  t.match(lines(child.out()).at(-1), /"msg":"closed"/, 'worker 0 closed gracefully')
})
