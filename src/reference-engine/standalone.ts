/** The engine as its own process (`npm run engine`): the only engine file that reads the environment or listens. */
import '../shared/runtime-guard.js'
import type { Server } from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'
import closeWithGrace from 'close-with-grace'
import { stopAccepting } from '../shared/drain.js'
import { buildEngine } from './engine.js'
import {
  DRAIN_IDLE_GRACE_MS,
  EngineEnvError,
  IN_FLIGHT_GRACE_MS,
  loadEngineEnv,
  type EngineSettings
} from './engine-env.js'
import { EngineMetrics } from './metrics.js'
import { OtelEnv } from '../../schemas/env.js'
import { readEnv } from '../shared/env.js'
import { tracingSettingsOf } from '../shared/tracing-settings.js'

let settings: EngineSettings
try {
  settings = loadEngineEnv(process.env)
} catch (err) {
  if (!(err instanceof EngineEnvError)) throw err
  process.stderr.write(`portfolio-engine: ${err.message}\n`)
  process.exit(1)
}

// The gateway's OTEL_* variables (decision: traces); with no endpoint, no SDK is loaded.
const otel = readEnv(OtelEnv, process.env)
const traced = otel.ok
  ? tracingSettingsOf(otel.value, 'portfolio-engine', process.env)
  : { ok: false as const, message: `${otel.name} is invalid: ${otel.problem}; expected ${otel.expected}` }
if (!traced.ok) {
  process.stderr.write(`portfolio-engine: ${traced.message}\n`)
  process.exit(1)
}
const tracing =
  traced.value === undefined
    ? undefined
    : (await import('../shared/tracing-sdk.js')).startTracing(traced.value, {}, { followCaller: true })

const lifecycle = { draining: false }
let metricsServer: Server | undefined
const metrics = settings.metricsPort === undefined ? undefined : new EngineMetrics()
const engine = await buildEngine({
  ...(metrics === undefined ? {} : { metrics }),
  imageDir: settings.imageDir,
  logger: { level: 'info' },
  lifecycle,
  idempotencyTtlMs: settings.idempotencyTtlS * 1000,
  ...(tracing === undefined ? {} : { tracer: tracing.tracer }),
  ...(settings.redisUrl === undefined ? {} : { redisUrl: settings.redisUrl })
})

// On SIGTERM/SIGINT the notice comes first, so the gateways' checks take this engine out of rotation before it stops
// accepting (decision: the engine drains too).
closeWithGrace(
  { delay: settings.drainNoticeMs + DRAIN_IDLE_GRACE_MS + IN_FLIGHT_GRACE_MS },
  async ({ signal, err }) => {
    lifecycle.draining = true
    if (err !== undefined) engine.log.error({ err }, 'closing the engine after an error')
    else {
      engine.log.info(
        { signal, noticeMs: settings.drainNoticeMs },
        'draining: /health answers 500, finishing requests in flight'
      )
      await sleep(settings.drainNoticeMs)
      await stopAccepting(engine.server, DRAIN_IDLE_GRACE_MS)
      engine.log.info('stopped accepting connections')
    }
    await engine.close()
    // Last, so a scrape during the drain still sees it.
    metricsServer?.close()
    metricsServer?.closeAllConnections()
    await tracing?.shutdown(2_000)
    engine.log.info('closed')
  }
)

// Before the engine port, so a busy metrics port stops start-up before any gateway sees this engine.
if (metrics !== undefined && settings.metricsPort !== undefined) {
  try {
    metricsServer = await metrics.listen(settings.host, settings.metricsPort)
  } catch (err) {
    process.stderr.write(
      `portfolio-engine: ENGINE_METRICS_PORT=${settings.metricsPort} ` +
        `cannot be used on ${settings.host}: ${(err as Error).message}\n`
    )
    process.exit(1)
  }
}

await engine.listen({ port: settings.port, host: settings.host })
// The store's kind, not its URL: that may carry a password.
engine.log.info(
  {
    imageDir: settings.imageDir,
    drainNoticeMs: settings.drainNoticeMs,
    metricsPort: settings.metricsPort,
    store: settings.redisUrl === undefined ? 'memory' : 'redis'
  },
  'portfolio engine ready'
)
