/** The limits layer: store, shedder signals, rate-limit hook and idempotency records. */
import type { FastifyBaseLogger, FastifyInstance, onRequestHookHandler } from 'fastify'
import type { LimitsConfig } from '../config.js'
import type { EngineClient } from '../engine-client/client.js'
import type { LimitsMetrics, RedisStoreMetrics } from '../observability/metrics.js'
import { Idempotency } from './idempotency.js'
import { MemoryStore } from './memory-store.js'
import { rateLimitHook } from './rate-limit.js'
import { watchEventLoop, type EventLoopWatch, type LoadShedder } from './shedding.js'
import type { LimitStore, UploadLeaseStore } from './store.js'

export interface Limits {
  /** onRequest, after auth. */
  rateLimit?: onRequestHookHandler
  idempotency: Idempotency
  /** Undefined when the store is in the process. */
  uploadCount?: SharedUploadCount
}

export interface SharedUploadCount {
  store: UploadLeaseStore
  log: FastifyBaseLogger
  metrics: { uploadCapFailedOpen: () => void }
}

/** Redis's modules load only when configured, so a gateway without Redis starts without them. */
export async function openLimitStore (
  config: LimitsConfig,
  deps: { log: FastifyBaseLogger, metrics: RedisStoreMetrics }
): Promise<LimitStore> {
  if (config.redis === undefined) return new MemoryStore()
  const { RedisStore } = await import('./redis-store.js')
  return new RedisStore({ redis: config.redis, log: deps.log, metrics: deps.metrics })
}

export interface LimitsDeps {
  engine: EngineClient
  shedder: LoadShedder
  store: LimitStore
  metrics: LimitsMetrics & SharedUploadCount['metrics']
  callTimeoutMs: number
}

/** The event loop is watched from onReady, so start-up work is not mistaken for load. */
export function buildLimits (app: FastifyInstance, config: LimitsConfig, deps: LimitsDeps): Limits {
  const { engine, shedder, store, metrics } = deps
  const eventLoop = config.shedEventLoopDelayMs > 0 ? lazyWatch(config.shedEventLoopDelayMs) : undefined
  if (eventLoop !== undefined) {
    app.addHook('onReady', async () => { eventLoop.start() })
    app.addHook('onClose', async () => { eventLoop.stop() })
  }
  const signals = { ...(eventLoop === undefined ? {} : { eventLoop }), engineQueueFull: () => engine.queueFull() }
  shedder.arm(signals, metrics, app.log)
  const rateLimit = config.ratePerMinute > 0 ? rateLimitHook(store, config.ratePerMinute, metrics) : undefined
  const pendingTtl = pendingTtlMs(deps.callTimeoutMs)
  return {
    ...(rateLimit === undefined ? {} : { rateLimit }),
    ...(store.uploads === undefined ? {} : { uploadCount: { store: store.uploads, log: app.log, metrics } }),
    idempotency: new Idempotency({ store, ttlS: config.idempotencyTtlS, pendingTtlMs: pendingTtl, metrics })
  }
}

/**
 * A claim outlives the longest request the server allows, since one that expired while its request still ran would
 * let a retry reach the engine too; it matters only when an instance dies mid-request.
 */
export function pendingTtlMs (callTimeoutMs: number): number {
  return callTimeoutMs + PENDING_MARGIN_MS
}
/** Node checks requestTimeout every connectionsCheckingInterval (30 s), so a request can run that much longer. */
export const PENDING_MARGIN_MS = 35_000

function lazyWatch (boundMs: number): EventLoopWatch & { start: () => void } {
  let watch: EventLoopWatch | undefined
  return {
    start: () => { watch ??= watchEventLoop(boundMs) },
    lagging: () => watch?.lagging() === true,
    stop: () => watch?.stop()
  }
}
