/**
 * The limits layer, built once from the config: the store (memory or Redis),
 * the shedder's signals, the rate-limit hook and the idempotency records. What they
 * refuse or let through is counted in the gateway's metrics.
 */
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
  /** onRequest, after auth; undefined when RATE_LIMIT_PER_MINUTE=0. */
  rateLimit?: onRequestHookHandler
  idempotency: Idempotency
  /** The per-user upload cap's count across gateways (DECISIONS 23); undefined in the process. */
  uploadCount?: SharedUploadCount
}

/** What the upload share needs of the shared store (src/limits/upload-share.ts). */
export interface SharedUploadCount {
  store: UploadLeaseStore
  log: FastifyBaseLogger
  metrics: { uploadCapFailedOpen: () => void }
}

/**
 * The store of counts, claims and upload leases: in this process, or Redis when configured. The
 * Redis client's modules load only then, so a gateway without Redis starts without them. The caller closes it.
 */
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

/**
 * Build the layer for `app` on `store`. The event loop is watched from onReady,
 * so start-up work (loading, compiling routes) is not mistaken for load.
 */
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
 * How long an in-flight claim holds: past the longest request the server
 * allows (receiving it, requestTimeout 180 s, then UPSTREAM_TIMEOUT_MS for the
 * engine: `callTimeoutMs`), plus a margin for the server's timeout checks and
 * the store's clocks. Independent of IDEMPOTENCY_TTL_S: a claim that expired
 * while its request still ran would let a retry reach the engine as well. It
 * only matters when an instance dies mid-request; otherwise the claim is
 * completed or released.
 */
export function pendingTtlMs (callTimeoutMs: number): number {
  return callTimeoutMs + PENDING_MARGIN_MS
}
/**
 * Node checks requestTimeout every connectionsCheckingInterval (30 s by default), so a request can run
 * that much longer.
 */
export const PENDING_MARGIN_MS = 35_000

/** An event-loop watch that starts measuring when told to; until then nothing lags. */
function lazyWatch (boundMs: number): EventLoopWatch & { start: () => void } {
  let watch: EventLoopWatch | undefined
  return {
    start: () => { watch ??= watchEventLoop(boundMs) },
    lagging: () => watch?.lagging() === true,
    stop: () => watch?.stop()
  }
}
