/** One gateway process; importing this module does nothing, so tests can. */
import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import closeWithGrace from 'close-with-grace'
import { SignJWT } from 'jose'
import { compose, type Gateway } from './compose.js'
import { ConfigError, loadConfig, type GatewayConfig } from './config.js'
import { GATEWAY_DRAIN } from './drain-timeline.js'
import { MetricsPortError, startMetricsServer, type MetricsServer } from './observability/metrics-server.js'
import { processLog } from './process-log.js'
import { gatewayStatus, gatewayVersion } from './observability/status.js'
import { stopAccepting } from './shared/drain.js'
import { drainWhenOrphaned, forkWorkers, workerIndex, type Workers } from './workers.js'

export async function main (env: NodeJS.ProcessEnv = process.env): Promise<void> {
  const config = configFrom(env)
  // GATEWAY_WORKERS: 0 is the process that was started, the others its copies (workers.ts).
  const worker = workerIndex()
  const log = await processLog(config)
  const gateway = await compose(config, { log: log.options })
  // Each worker's scrape target says which worker it is, so a dashboard can tell them apart or sum them.
  if (config.workers > 1) gateway.metrics.registry.setDefaultLabels({ worker: String(worker) })
  const metricsServer = await startMetrics(config, gateway, worker)
  const { app, lifecycle } = gateway
  let workers: Workers | undefined
  /** A copy that exited unasked: the others are drained and worker 0 exits 1, for the supervisor to restart all. */
  let lostWorker = false

  // In production /health answers 500 for a few seconds before the listener closes, so a load
  // balancer sees the instance leave before connections are refused. Development closes at once.
  const noticeMs = config.production ? GATEWAY_DRAIN.productionNoticeMs : 0
  closeWithGrace({ delay: GATEWAY_DRAIN.exitDeadlineMs }, async ({ signal, err }) => {
    if (err !== undefined) app.log.error({ err }, 'fatal error, shutting down')
    else app.log.info({ signal, noticeMs }, 'draining: /health answers 500, finishing requests in flight')
    lifecycle.draining = true
    // Every copy runs its own graceful close beside this one's.
    const copiesStopped = workers?.stop()
    if (err === undefined) {
      await sleep(noticeMs)
      await stopAccepting(app.server, GATEWAY_DRAIN.idleGraceMs)
    }
    await gateway.close()
    await metricsServer?.close()
    await copiesStopped
    app.log.info('closed')
    await log.flush()
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
  if (worker > 0) {
    drainWhenOrphaned(() => {
      if (!lifecycle.draining) process.kill(process.pid, 'SIGTERM')
    })
  }
  const workerFields = config.workers > 1 ? { worker, workers: config.workers } : {}
  app.log.info({ ...readyLine(config, gateway, metricsServer), ...workerFields }, 'gateway ready')
  if (config.jwt.source === 'static' && config.jwt.generated) {
    const { port } = app.server.address() as AddressInfo
    process.stdout.write(devTokenBanner(await devToken(config.jwt.key), port))
  }
}

function configFrom (env: NodeJS.ProcessEnv): GatewayConfig {
  try {
    return loadConfig(env)
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err
    exitWith(err.message)
  }
}

/** Metrics never share the public port (decision: metrics); a busy port stops start-up. */
async function startMetrics (
  config: GatewayConfig,
  gateway: Gateway,
  worker: number
): Promise<MetricsServer | undefined> {
  if (config.metricsPort === 0) return undefined
  const startedAt = Date.now() - Math.round(process.uptime() * 1000)
  const sources = { ...gateway.status, version: gatewayVersion(), startedAt }
  // A port per worker: one shared port would hand each scrape to a different worker's counters.
  const listen = { port: config.metricsPort + worker, host: config.host, status: () => gatewayStatus(sources) }
  try {
    return await startMetricsServer(gateway.metrics, listen)
  } catch (err) {
    if (!(err instanceof MetricsPortError)) throw err
    await gateway.close()
    exitWith(err.message)
  }
}

function exitWith (message: string): never {
  process.stderr.write(`portfolio-gateway: ${message}\n`)
  process.exit(1)
}

function readyLine (config: GatewayConfig, gateway: Gateway, metricsServer: MetricsServer | undefined): object {
  const { embeddedEngineUrl } = gateway
  const tracing = config.tracing
  return {
    upstream:
      embeddedEngineUrl === undefined
        ? (config.upstreamUrls ?? []).join(',')
        : `embedded reference engine at ${embeddedEngineUrl}`,
    metrics: metricsServer === undefined ? 'off' : `http://${config.host}:${metricsServer.port}/metrics`,
    // The collector's URL without credentials; OTEL_EXPORTER_OTLP_HEADERS is never logged.
    traces:
      tracing === undefined
        ? 'off'
        : `${withoutUserInfo(tracing.url)} ` +
          `(${tracing.sampler}${tracing.sampler.endsWith('traceidratio') ? ` ${tracing.ratio}` : ''})`
  }
}

/** No JWT_SECRET or key in development: a token for the generated secret, so the first curl works. */
async function devToken (secret: string): Promise<string> {
  return await new SignJWT({ sub: 'dev-user' })
    .setProtectedHeader({ alg: 'HS256', typ: 'JWT' })
    .setIssuedAt()
    .setExpirationTime('12h')
    .sign(new TextEncoder().encode(secret))
}

function devTokenBanner (token: string, port: number): string {
  return [
    '',
    'Development mode: no JWT_SECRET or JWT_PUBLIC_KEY set, so a random HS256 secret was generated.',
    'This token (sub=dev-user) is valid for 12 hours, until this process stops:',
    '',
    `  export TOKEN=${token}`,
    `  curl -H "Authorization: Bearer $TOKEN" http://localhost:${port}/api/portfolio/ping`,
    '',
    'Set JWT_SECRET to keep tokens across restarts; `npm run token -- --sub alice` then prints more.',
    ''
  ].join('\n')
}

function withoutUserInfo (url: string): string {
  const u = new URL(url)
  u.username = ''
  u.password = ''
  return u.href
}
