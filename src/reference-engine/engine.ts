/**
 * The reference portfolio engine (decision: upstream contract), an embeddable Fastify instance. It reads no
 * environment and does not listen: standalone.ts and the gateway do that.
 */
import { mkdir } from 'node:fs/promises'
import fastify, { type FastifyInstance, type FastifyServerOptions } from 'fastify'
import multipart from '@fastify/multipart'
import { CREATE_FORM_LIMITS, LIMITS } from '../../schemas/portfolio.js'
import { REQUEST_ID_HEADER, SERVICE_CONNECTED, type EngineHealth } from '../../schemas/upstream.js'
import type { HealthError } from '../../schemas/errors.js'
import { EngineError, STORE_RETRY_AFTER_S, structuredError, toEngineError } from './errors.js'
import { portfolioRoutes } from './portfolio-routes.js'
import { SCHEMA_VALIDATION } from '../shared/schema-validation.js'
import { isPartAFile } from '../shared/form-parts.js'
import type { PortfolioStore } from './store.js'
import { MemoryPortfolioStore } from './memory-store.js'
import type { EngineMetrics } from './metrics.js'
import { traceRequests } from '../shared/tracing-spans.js'
import type { Tracer } from '@opentelemetry/api'
// Declares route `config.handler`, the name an error reports as `function`.
import type {} from '../shared/route-config.js'

export interface EngineOptions {
  imageDir: string
  serviceName?: string
  logger?: FastifyServerOptions['logger']
  /** Keep portfolios in this Redis, shared with other engines; unset: in this process's memory. */
  redisUrl?: string
  idempotencyTtlMs?: number
  /** Set `draining` when shutdown starts (standalone.ts); the gateway's embedded engine never drains on its own. */
  lifecycle?: EngineLifecycle
  /** Where requests, store state and drain state are counted (ENGINE_METRICS_PORT); unset: no metrics. */
  metrics?: EngineMetrics
  /** A server span per request, under the caller's traceparent; unset: no tracing hooks at all. */
  tracer?: Tracer
}

export interface EngineLifecycle {
  readonly draining: boolean
}

/** As the gateway's own /health answers while it drains. */
export const DRAINING_HEALTH: HealthError = Object.freeze({ status: 'error', message: 'shutting down' })

declare module 'fastify' {
  interface FastifyInstance {
    portfolioStore: PortfolioStore
    /** The in-memory store, read synchronously by tests and tools; throws on an engine that uses Redis. */
    portfolios: MemoryPortfolioStore
  }
}

export const DEFAULT_SERVICE_NAME = 'portfolio-engine'

/**
 * The engine reads an upload while the gateway receives it (up to 180 s), and the gateway's engine leg may add
 * UPSTREAM_TIMEOUT_MS (at most 600 s) on top; test/routes/create/timing.test.ts holds it to the gateway's limits.
 */
export const ENGINE_REQUEST_TIMEOUT_MS = 180_000 + 600_000

export async function buildEngine (opts: EngineOptions): Promise<FastifyInstance> {
  const serviceName = opts.serviceName ?? DEFAULT_SERVICE_NAME
  await mkdir(opts.imageDir, { recursive: true })
  const app = fastify({
    logger: opts.logger ?? false,
    // The gateway sends its request id: the engine logs under that one (decision: request ids).
    requestIdHeader: REQUEST_ID_HEADER,
    bodyLimit: LIMITS.updateBodyMaxBytes,
    // Longer than the gateway pool's keep-alive, so the engine never closes a socket the pool is about to reuse.
    keepAliveTimeout: 72_000,
    requestTimeout: ENGINE_REQUEST_TIMEOUT_MS,
    connectionTimeout: 0,
    // A request on an open connection while the engine closes is served with `connection: close`, not refused with
    // Fastify's own 503, which is outside the contract (decision: the engine drains too).
    return503OnClosing: false,
    // The gateway's schema compiler and options: one schema, one way of counting.
    ajv: SCHEMA_VALIDATION
  })
  const store = await openStore(app, opts)
  // The gateway's limits, every one set, since busboy's defaults (Infinity for most) are not a policy. Text parts
  // declared as JSON are read as streams, so busboy counts them as files.
  await app.register(multipart, { limits: { ...CREATE_FORM_LIMITS, files: CREATE_FORM_LIMITS.parts }, isPartAFile })
  handleErrors(app, serviceName)
  if (opts.tracer !== undefined) traceRequests(app, opts.tracer)
  const lifecycle = opts.lifecycle ?? { draining: false }
  opts.metrics?.instrument(app, { store, storeKind: opts.redisUrl === undefined ? 'memory' : 'redis', lifecycle })
  addHealth(app, store, lifecycle)
  await app.register(portfolioRoutes, { store, imageDir: opts.imageDir })
  return app
}

async function openStore (app: FastifyInstance, opts: EngineOptions): Promise<PortfolioStore> {
  const keyTtl = opts.idempotencyTtlMs === undefined ? {} : { keyTtlMs: opts.idempotencyTtlMs }
  // ioredis loads only for an engine that keeps its portfolios in Redis.
  const store: PortfolioStore = opts.redisUrl === undefined
    ? new MemoryPortfolioStore(keyTtl)
    : new (await import('./redis-store.js')).RedisPortfolioStore({ url: opts.redisUrl, log: app.log, ...keyTtl })
  app.decorate('portfolioStore', store)
  app.decorate('portfolios', {
    getter (): MemoryPortfolioStore {
      if (store instanceof MemoryPortfolioStore) return store
      throw new Error('this engine keeps its portfolios in Redis: use portfolioStore')
    }
  })
  // onClose runs after the HTTP server has closed and its last request has finished
  // (test/reference-engine/redis-store.test.ts).
  app.addHook('onClose', async () => {
    await store.close()
  })
  return store
}

function handleErrors (app: FastifyInstance, serviceName: string): void {
  app.setErrorHandler(function engineErrorHandler (err, request, reply) {
    const engineError = toEngineError(err)
    // An outage of the store is the store's (logged once by it), not a failure of this request's code.
    if (engineError.code === 'SERVICE_UNAVAILABLE') {
      request.log.warn(
        { code: engineError.code, reason: (engineError.cause as Error).message },
        'engine request refused: store unavailable'
      )
    } else if (engineError.statusCode >= 500) request.log.error({ err }, 'engine request failed')
    else request.log.info({ code: engineError.code, message: engineError.message }, 'engine request refused')
    const fn = request.routeOptions.config.handler ?? 'engine'
    if (engineError.code === 'SERVICE_UNAVAILABLE') void reply.header('retry-after', String(STORE_RETRY_AFTER_S))
    return reply
      .code(engineError.statusCode)
      .send(structuredError(serviceName, fn, engineError.code, engineError.message))
  })

  app.setNotFoundHandler(function notFound (request, reply) {
    const error = new EngineError('NOT_FOUND', `route ${request.method} ${request.url.split('?')[0] ?? ''} not found`)
    return reply.code(error.statusCode).send(structuredError(serviceName, 'notFound', error.code, error.message))
  })
}

function addHealth (app: FastifyInstance, store: PortfolioStore, lifecycle: EngineLifecycle): void {
  // While draining, each answer ends its connection, so a kept-alive client (the gateway's pool) opens its next one
  // elsewhere and sends nothing on a socket the listener is closing.
  app.addHook('onSend', (_request, reply, payload, done) => {
    if (lifecycle.draining) reply.header('connection', 'close')
    done(null, payload)
  })

  app.get('/health', { config: { handler: 'health' } }, async function health (_request, reply): Promise<
    EngineHealth | HealthError
  > {
    // A 500 takes this engine out of the gateways' rotation at their next check (decision: several engine endpoints).
    if (lifecycle.draining) {
      reply.code(500)
      return DRAINING_HEALTH
    }
    const services = await store.state()
    const ok = services.database === SERVICE_CONNECTED && services.cache === SERVICE_CONNECTED
    return { status: ok ? 'ok' : 'degraded', services: { database: services.database, cache: services.cache } }
  })
}
