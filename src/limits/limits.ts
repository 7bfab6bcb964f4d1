/**
 * The limits layer, built once from the config: the store (memory or Redis),
 * the shedding and rate-limit hooks, and the idempotency records.
 */
import type { FastifyBaseLogger, onRequestHookHandler } from 'fastify'
import type { LimitsConfig } from '../config.js'
import type { EngineClient } from '../engine-client/client.js'
import { Idempotency } from './idempotency.js'
import { MemoryStore } from './memory-store.js'
import { rateLimitHook } from './rate-limit.js'
import { RedisStore } from './redis-store.js'
import { shedHook, watchEventLoop } from './shedding.js'
import type { LimitStore } from './store.js'

export interface Limits {
  /** onRequest, before auth: cheap, refuses when overloaded. */
  shed: onRequestHookHandler
  /** onRequest, after auth; undefined when RATE_LIMIT_PER_MINUTE=0. */
  rateLimit?: onRequestHookHandler
  idempotency: Idempotency
  close: () => Promise<void>
}

export function buildLimits (config: LimitsConfig, engine: EngineClient, log: FastifyBaseLogger, callTimeoutMs: number): Limits {
  const store: LimitStore = config.redisUrl === undefined ? new MemoryStore() : new RedisStore({ url: config.redisUrl, log })
  const eventLoop = config.shedEventLoopDelayMs > 0 ? watchEventLoop(config.shedEventLoopDelayMs) : undefined
  const rateLimit = config.ratePerMinute > 0 ? rateLimitHook(store, config.ratePerMinute) : undefined
  return {
    shed: shedHook({ ...(eventLoop === undefined ? {} : { eventLoop }), engineQueueFull: () => engine.queueFull() }),
    ...(rateLimit === undefined ? {} : { rateLimit }),
    // An in-flight claim outlives the longest engine call, then frees the key if its instance died.
    idempotency: new Idempotency({ store, ttlS: config.idempotencyTtlS, pendingTtlMs: Math.min(config.idempotencyTtlS * 1000, callTimeoutMs + 5_000) }),
    close: async () => {
      eventLoop?.stop()
      await store.close()
    }
  }
}
