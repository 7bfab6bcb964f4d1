/**
 * The gateway as a real process at its edges: a busy or served METRICS_PORT,
 * and SIGTERM (the request in flight answered, the access lines flushed, a
 * lingering refused upload cut rather than waited for).
 */
import { once } from 'node:events'
import { connect, createConnection, createServer as createNetServer, type AddressInfo } from 'node:net'
import t, { type Test } from 'tap'
import { Agent, request } from 'undici'
import { refusedPort, startStubUpstream } from '../fixtures/stub-upstream.js'
import { GATEWAY_DRAIN } from '../src/drain-timeline.js'
import { bearer, SECRET } from './helpers/app.js'
import { parseExposition, valueOf } from './helpers/prometheus.js'
import { ensureBuilt } from './helpers/processes.js'
import { client, exitOf, gatewayUrl, lines, SERVER, start } from './helpers/gateway-process.js'

// Three gateway processes started and shut down in turn: 35 s on a busy 2-core machine, too near tap's 60 s default.
t.setTimeout(120_000)

t.before(ensureBuilt)

async function occupiedPort (t: Test): Promise<number> {
  const holder = createNetServer().listen(0, '127.0.0.1')
  await once(holder, 'listening')
  t.teardown(() => new Promise<void>((resolve) => holder.close(() => resolve())))
  return (holder.address() as AddressInfo).port
}

t.test('a busy METRICS_PORT stops start-up with one line naming it', async (t) => {
  const port = await occupiedPort(t)
  const child = start(t, SERVER, { PORT: '0', HOST: '127.0.0.1', JWT_SECRET: SECRET, UPSTREAM_URL: 'http://127.0.0.1:9', METRICS_PORT: String(port) })
  t.same(await exitOf(child), { code: 1, signal: null })
  t.same(lines(child.err()), [
    `portfolio-gateway: METRICS_PORT=${port} is already in use on 127.0.0.1: pick a free port, or set METRICS_PORT=0 to turn metrics off`
  ])
  t.notMatch(child.out(), /gateway ready/, 'it never served')
})

t.test('the process serves metrics on METRICS_PORT and closes it on SIGTERM', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const free = await refusedPort()
  const child = start(t, SERVER, { PORT: '0', HOST: '127.0.0.1', LOG_LEVEL: 'info', JWT_SECRET: SECRET, UPSTREAM_URL: stub.url, METRICS_PORT: String(free) })
  const [, metricsUrl] = await child.waitForOutput(/"metrics":"(http:\/\/127\.0\.0\.1:\d+)\/metrics"/) as [string, string]
  t.equal(metricsUrl, `http://127.0.0.1:${free}`)
  const url = await gatewayUrl(child)
  const dispatcher = client(t)
  const ping = await request(`${url}/api/portfolio/ping`, { dispatcher, headers: bearer() })
  t.equal(ping.statusCode, 200)
  await ping.body.dump()
  const publicMetrics = await request(`${url}/metrics`, { dispatcher })
  t.equal(publicMetrics.statusCode, 404, 'never on the public port')
  await publicMetrics.body.dump()

  const scraped = await request(`${metricsUrl}/metrics`, { dispatcher })
  t.equal(scraped.statusCode, 200)
  const samples = parseExposition(await scraped.body.text())
  t.equal(valueOf(samples, 'gateway_requests_total', { route: '/api/portfolio/ping', method: 'GET', status_class: '2xx' }), 1)
  t.equal(valueOf(samples, 'gateway_engine_calls_total', { call: 'ping', outcome: 'ok', endpoint: `127.0.0.1:${stub.port}` }), 1)

  child.proc.kill('SIGTERM')
  t.same(await exitOf(child), { code: 0, signal: null })
  const connect = createConnection(free, '127.0.0.1')
  const [err] = await once(connect, 'error') as [NodeJS.ErrnoException]
  t.equal(err.code, 'ECONNREFUSED', 'the metrics listener is closed')
})

t.test('SIGTERM right after N requests: all N access lines reach stdout (the async log buffer is flushed at shutdown)', async (t) => {
  // Lines leave the asynchronous destination in 4 KiB batches (src/server.ts);
  // the signal comes the moment the last answer is in, while the tail is still buffered.
  const N = 300
  const child = start(t, SERVER, { PORT: '0', HOST: '127.0.0.1', LOG_LEVEL: 'info', JWT_SECRET: SECRET, UPSTREAM_URL: 'http://127.0.0.1:9' })
  const url = await gatewayUrl(child)
  const dispatcher = new Agent({ connections: 8, keepAliveTimeout: 10, keepAliveMaxTimeout: 10 })
  t.teardown(() => dispatcher.close())
  const statuses = await Promise.all(Array.from({ length: N }, async (_, i) => {
    const res = await request(`${url}/health?n=${i}`, { dispatcher })
    await res.body.dump()
    return res.statusCode
  }))
  child.proc.kill('SIGTERM')
  t.same(await exitOf(child), { code: 0, signal: null })
  t.equal(statuses.filter((s) => s === 200).length, N, 'every request answered 200')

  const access = lines(child.out())
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as { msg?: string, url?: string, status?: number })
    .filter((e) => e.msg === 'request' && e.url?.startsWith('/health?n=') === true)
  t.equal(access.length, N, 'one access line per request, none lost')
  t.equal(new Set(access.map((e) => e.url)).size, N, 'each request once')
  t.match(lines(child.out()).at(-1), /"msg":"closed"/, 'the last line written is the shutdown\'s own')
})

t.test('SIGTERM while a refused upload lingers at a good rate: the linger is cut, the process exits with its "closed" line', async (t) => {
  const child = start(t, SERVER, { PORT: '0', HOST: '127.0.0.1', LOG_LEVEL: 'info', JWT_SECRET: SECRET, UPSTREAM_URL: 'http://127.0.0.1:9' })
  const url = new URL(await gatewayUrl(child))
  const upload = connect({ port: Number(url.port), host: url.hostname, allowHalfOpen: true })
  upload.on('error', () => {}) // the cut resets it
  t.teardown(() => upload.destroy())
  let answer = ''
  upload.setEncoding('latin1').on('data', (c: string) => { answer += c })
  const lingering = once(upload, 'end')
  upload.write('POST /api/portfolio/create HTTP/1.1\r\nhost: x\r\nauthorization: Bearer bad\r\n' +
    'content-type: multipart/form-data; boundary=b\r\ncontent-length: 8388608\r\n\r\n' + 'x'.repeat(1024))
  await lingering
  t.match(answer, /^HTTP\/1\.1 401 Unauthorized\r\n/, 'the refusal was read; the body is still coming')
  // 40 KiB/s, ten times the uploads' minimum rate: nothing but the shutdown would end this linger for minutes.
  const trickle = setInterval(() => { if (upload.writable) upload.write(Buffer.alloc(4096, 0x78)) }, 100)
  // Not once(): it rejects on the reset or broken pipe that the cut brings.
  const cut = new Promise((resolve) => upload.once('close', resolve))
  t.teardown(() => clearInterval(trickle))
  const signalled = performance.now()
  child.proc.kill('SIGTERM')
  t.same(await exitOf(child), { code: 0, signal: null })
  const tookMs = performance.now() - signalled
  t.ok(tookMs < GATEWAY_DRAIN.productionNoticeMs, `exited ${tookMs.toFixed(0)} ms after SIGTERM, not at the kill deadline`)
  t.match(lines(child.out()).at(-1), /"msg":"closed"/, 'the last line written is the shutdown\'s own')
  await cut
  clearInterval(trickle)
})
