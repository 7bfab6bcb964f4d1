/**
 * The gateway process: the only file with side effects. Config, logger,
 * engine pool, listen, signals, graceful close.
 */
import './shared/runtime-guard.js'
import { mkdtemp, rm } from 'node:fs/promises'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import closeWithGrace from 'close-with-grace'
import { stopAccepting } from './shared/drain.js'
import { GATEWAY_DRAIN } from './drain-timeline.js'
import pino, { type DestinationStream } from 'pino'
import { buildApp } from './app.js'
import { ConfigError, loadConfig } from './config.js'
import { EngineClient } from './engine-client/client.js'
import { namesAHost, serversLookup } from './engine-client/endpoints.js'
import { buildEngine } from './reference-engine/engine.js'
import { MetricsPortError, startMetricsServer, type MetricsServer } from './observability/metrics-server.js'
import { gatewayStatus, gatewayVersion } from './observability/status.js'
import { drainWhenOrphaned, forkWorkers, workerIndex, type Workers } from './workers.js'

let config
try {
  config = loadConfig(process.env)
} catch (err) {
  if (!(err instanceof ConfigError)) throw err
  process.stderr.write(`portfolio-gateway: ${err.message}\n`)
  process.exit(1)
}

/** GATEWAY_WORKERS: 0 is the process that was started, the others its copies (workers.ts). */
const worker = workerIndex()

/**
 * Log lines go to stdout through pino's asynchronous destination (sonic-boom):
 * lines gather in memory and leave in one write of at least 4 KiB, or every
 * 250 ms when traffic is light, instead of one blocking write(2) per access
 * line (docs/performance-history.md, "Logging"). The shutdown below flushes what is
 * still buffered, so no access line is lost on SIGTERM. The buffer is bounded
 * (16 MiB): if stdout stops draining, lines past it are dropped rather than
 * growing memory without limit or blocking requests on the write.
 */
const jsonDestination = (): DestinationStream & { flush: (cb: (err?: Error) => void) => void } =>
  pino.destination({ dest: 1, sync: false, minLength: 4096, maxLength: 16 * 1024 * 1024, periodicFlush: 250 })

/**
 * A developer at a terminal reads lines, not JSON: pino-pretty formats each
 * line in this process and it is written at once, so lines keep their order
 * with the token banner below. Production, and any stdout that is not a
 * terminal (a pipe, a file, a log shipper), gets the JSON lines.
 */
const readable = !config.production && process.stdout.isTTY
// Loaded only here: production and piped runs never pay for pino-pretty's modules at start.
const prettyLine = readable ? (await import('pino-pretty')).prettyFactory({ colorize: true, translateTime: 'HH:MM:ss.l', ignore: 'pid,hostname' }) : undefined
// A terminal that goes away (the developer closed it) fails every write with EIO: stop writing, and
// let the SIGHUP drain run, rather than raise an uncaught error per line while shutting down.
let terminalGone = false
if (prettyLine !== undefined) process.stdout.on('error', () => { terminalGone = true })
const logDestination: DestinationStream = prettyLine !== undefined
  ? { write: (line: string) => { if (!terminalGone) process.stdout.write(prettyLine(line)) } }
  : jsonDestination()
const flushLog = async (): Promise<void> => {
  if ('flush' in logDestination && typeof logDestination.flush === 'function') {
    await new Promise<void>((resolve) => (logDestination.flush as (cb: () => void) => void)(() => resolve()))
  }
}

const logger = {
  level: config.logLevel,
  stream: logDestination,
  // Nothing logs headers today; this keeps a future `req` serializer from leaking tokens.
  redact: { paths: ['req.headers.authorization', 'headers.authorization', 'req.headers.cookie'], censor: '[redacted]' }
}

// DECISIONS 29: traces only when an OTLP endpoint is set; otherwise the SDK is not even loaded.
const sdk = config.tracing === undefined ? undefined : await import('./shared/tracing-sdk.js')
const tracing = config.tracing === undefined ? undefined : sdk!.startTracing(config.tracing)
/** The embedded engine, traced too when tracing is on, as its own service (its spans nest under the gateway's tries). */
const engineTracing = config.tracing === undefined || config.upstreamUrl !== undefined ? undefined : sdk!.startTracing({ ...config.tracing, serviceName: 'portfolio-engine' }, {}, { followCaller: true })
/** How long the last spans get to leave on shutdown: a dead collector never holds the exit up longer. */
const TRACE_FLUSH_MS = 2_000

// No UPSTREAM_URL: run the reference engine in this process, on loopback only,
// with an image folder of its own that goes when the process does.
const imageDir = config.upstreamUrl === undefined ? await mkdtemp(join(tmpdir(), 'portfolio-gateway-engine-')) : undefined
const embedded = imageDir === undefined
  ? undefined
  : await buildEngine({ imageDir, logger: { level: config.logLevel, name: 'engine', stream: logDestination }, ...(engineTracing === undefined ? {} : { tracer: engineTracing.tracer }) })
const upstreamUrl = config.upstreamUrl ?? await embedded!.listen({ port: 0, host: '127.0.0.1' })

// DECISIONS 24: every endpoint of UPSTREAM_URL's list. A name is resolved in the background (until its
// first answer undici resolves it per connection), so a slow DNS never holds up start-up.
// With UPSTREAM_DNS_SERVERS the pools' connections to a name ask those servers too (connectWithLookup): the
// system resolver may not know a name only they serve (a cluster DNS the host does not use).
const engine = new EngineClient({ url: config.upstreamUrls ?? upstreamUrl, timeoutMs: config.upstreamTimeoutMs, tryTimeoutMs: config.upstreamTryTimeoutMs, maxQueue: config.limits.upstreamMaxQueue, resolveIntervalMs: config.upstreamDnsRefreshMs, ...(config.upstreamDnsServers === undefined ? {} : { lookup: serversLookup(config.upstreamDnsServers), connectWithLookup: true }) })
// Listen with the names' addresses when the servers answer within the lookup deadline (at most 5 s).
// Silent or failing servers: the gateway listens anyway (calls still ask them per connection), and
// the log says so as soon as it is installed (engine-log.ts: `engine name lookup failed`).
if (config.upstreamDnsServers !== undefined) await engine.ready()
const lifecycle = { draining: false }
// With JWT_JWKS_URL, buildApp fetches the key set once, so the gateway listens only after it (DECISIONS 13).
const app = await buildApp(config, { engine, lifecycle, logger, ...(tracing === undefined ? {} : { tracing }) })
// Each worker's scrape target says which worker it is, so a dashboard can tell them apart or sum them.
if (config.workers > 1) app.metrics.registry.setDefaultLabels({ worker: String(worker) })
// Not an error (nothing is harmed), but an operator who set it expects it used: say that it is not.
if (config.upstreamDnsServers !== undefined && !namesAHost(config.upstreamUrls ?? [])) {
  app.log.warn({ upstreamDnsServers: config.upstreamDnsServers }, 'UPSTREAM_DNS_SERVERS is set, but UPSTREAM_URL names no host (only IP addresses, or unset): nothing is resolved, the servers are never asked')
}

// DECISIONS 18: metrics on a listener of their own, never the public port; a busy port stops start-up.
let metricsServer: MetricsServer | undefined
if (config.metricsPort !== 0) {
  try {
    // GET /status beside /metrics: read from each part when asked.
    const status = { version: gatewayVersion(), startedAt: Date.now() - Math.round(process.uptime() * 1000), lifecycle, engine, store: app.storeStatus, keySet: app.keySet }
    // A port per worker: one shared port would hand each scrape to a different worker's counters.
    const where = { port: config.metricsPort + worker, host: config.host }
    metricsServer = await startMetricsServer(app.metrics, { ...where, status: () => gatewayStatus(status) })
  } catch (err) {
    if (!(err instanceof MetricsPortError)) throw err
    process.stderr.write(`portfolio-gateway: ${err.message}\n`)
    process.exit(1)
  }
}

/**
 * In production, /health answers 500 for a few seconds before the listener
 * closes, so a load balancer sees the instance leave before connections are
 * refused. Development closes at once.
 */
const DRAIN_NOTICE_MS = config.production ? GATEWAY_DRAIN.productionNoticeMs : 0

/** Worker 0's copies (GATEWAY_WORKERS > 1), forked once it listens. */
let workers: Workers | undefined
/** A copy that exited unasked: the others are drained and worker 0 exits 1, for the supervisor to restart them all. */
let lostWorker = false

closeWithGrace({ delay: GATEWAY_DRAIN.exitDeadlineMs }, async ({ signal, err }) => {
  if (err !== undefined) app.log.error({ err }, 'fatal error, shutting down')
  else app.log.info({ signal, noticeMs: DRAIN_NOTICE_MS }, 'draining: /health answers 500, finishing requests in flight')
  lifecycle.draining = true
  // Every copy runs its own graceful close beside this one's.
  const copiesStopped = workers?.stop()
  if (err === undefined) {
    await sleep(DRAIN_NOTICE_MS)
    await stopAccepting(app.server, GATEWAY_DRAIN.idleGraceMs)
  }
  await app.close()
  await metricsServer?.close()
  await embedded?.close()
  await Promise.all([tracing?.shutdown(TRACE_FLUSH_MS), engineTracing?.shutdown(TRACE_FLUSH_MS)])
  if (imageDir !== undefined) await rm(imageDir, { recursive: true, force: true })
  await copiesStopped
  app.log.info('closed')
  await flushLog()
  if (lostWorker) process.exit(1)
})

// SO_REUSEPORT only with workers: a lone gateway that finds its port taken should fail, not share it.
// Fastify hands these to net's listen() whole; its types do not name reusePort (Node 22.12+) yet.
const listenOptions = { port: config.port, host: config.host, reusePort: config.workers > 1 }
await app.listen(listenOptions)
if (config.workers > 1 && worker === 0) {
  workers = forkWorkers(config.workers, (index, code, signal) => {
    app.log.error({ worker: index, code, signal }, 'a worker exited: draining every worker')
    lostWorker = true
    process.kill(process.pid, 'SIGTERM')
  })
}
// A copy whose worker 0 is gone (killed, crashed) drains itself; one already draining goes on.
if (worker > 0) drainWhenOrphaned(() => { if (!lifecycle.draining) process.kill(process.pid, 'SIGTERM') })
app.log.info({
  upstream: embedded === undefined ? (config.upstreamUrls ?? [upstreamUrl]).join(',') : `embedded reference engine at ${upstreamUrl}`,
  metrics: metricsServer === undefined ? 'off' : `http://${config.host}:${metricsServer.port}/metrics`,
  // The collector's URL without credentials; OTEL_EXPORTER_OTLP_HEADERS is never logged.
  traces: config.tracing === undefined ? 'off' : `${withoutUserInfo(config.tracing.url)} (${config.tracing.sampler}${config.tracing.sampler.endsWith('traceidratio') ? ` ${config.tracing.ratio}` : ''})`,
  ...(config.workers > 1 ? { worker, workers: config.workers } : {})
}, 'gateway ready')

if (config.jwt.generated) {
  const token = app.jwt.sign({ sub: 'dev-user' }, { expiresIn: '12h' })
  process.stdout.write([
    '',
    'Development mode: no JWT_SECRET or JWT_PUBLIC_KEY set, so a random HS256 secret was generated.',
    'This token (sub=dev-user) is valid for 12 hours, until this process stops:',
    '',
    `  export TOKEN=${token}`,
    `  curl -H "Authorization: Bearer $TOKEN" http://localhost:${(app.server.address() as AddressInfo).port}/api/portfolio/ping`,
    '',
    'Set JWT_SECRET to keep tokens across restarts; `npm run token -- --sub alice` then prints more.',
    ''
  ].join('\n'))
}

function withoutUserInfo (url: string): string {
  const u = new URL(url)
  u.username = ''
  u.password = ''
  return u.href
}
