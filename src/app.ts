/**
 * The whole request path, registered in the order it runs.
 *
 *   request -> [in front of Fastify (http/front.ts): no Host 400, Expect 417, /api/* while overloaded 503]
 *           -> request id, trace context, metrics -> [bearer scope: JWT, rate limit] -> schema -> handler
 *           -> engine pool
 *   every failure -> error handler -> one of the interface's three shapes
 */
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyReply } from 'fastify'
import { REQUEST_ID_HEADER } from '../schemas/upstream.js'
import type { GatewayConfig } from './config.js'
import type { EngineClient } from './engine-client/client.js'
import { createAuthenticator } from './auth/jwt.js'
import type { KeySet } from './auth/key-set.js'
import { installErrorHandling } from './http/error-handler.js'
import { requestIdFrom } from './http/request-id.js'
import { clientErrorAnswerer } from './http/client-error.js'
import { closeConnectionsWhenNeeded, Lingers, type LingerLimits } from './http/connection-close.js'
import { createFrontServer, inviteBody } from './http/front.js'
import { idleTimeoutMs, SERVER_LIMITS } from './http/limits.js'
import { engineHealthRoutes, livenessRoutes, type Lifecycle } from './routes/health.js'
import { createPortfolioRoutes } from './routes/create/route.js'
import { MIN_RATE, MinRate, type MinRateOptions } from './routes/create/min-rate.js'
import { portfolioRoutes } from './routes/portfolio.js'
import { SCHEMA_VALIDATION } from './shared/schema-validation.js'
import { registerOpenApi } from './routes/openapi.js'
import type { GatewayMetrics } from './observability/metrics.js'
import { installRequestMetrics } from './observability/request-metrics.js'
import { clientAddressOf, installTraceContext } from './observability/trace-context.js'
import { logEngineEvents } from './observability/engine-log.js'
import { installTracing, traceUploadWait } from './observability/tracing.js'
import type { Tracing } from './shared/tracing-sdk.js'
import { AccessLines } from './observability/access-log.js'
import { requestLoggerFactory } from './observability/request-logger.js'
import { buildLimits } from './limits/limits.js'
import { LoadShedder } from './limits/shedding.js'
import type { LimitStore } from './limits/store.js'

/** The parts the app uses and never closes: src/compose.ts builds them, and closes them after the app. */
export interface AppDeps {
  engine: EngineClient
  metrics: GatewayMetrics
  /** Rate-limit counts, idempotency records and upload leases (memory or Redis). */
  store: LimitStore
  /** JWT_JWKS_URL's keys, fetched once already; absent with a static key. */
  keySet?: KeySet | undefined
  /** The gateway's pino logger; absent: silent. */
  logger?: FastifyBaseLogger
  lifecycle?: Lifecycle
  /** How long the engine may stop reading an upload (tests shorten it). */
  uploadStallTimeoutMs?: number
  /** The uploads' minimum rate; tests shorten it. */
  uploadMinRate?: MinRateOptions
  /** Overrides LINGER_* for a test. */
  linger?: Partial<LingerLimits>
  /** Absent: no tracing hook at all. */
  tracing?: Tracing
}

export async function buildApp (config: GatewayConfig, deps: AppDeps): Promise<FastifyInstance> {
  const lifecycle = deps.lifecycle ?? { draining: false }
  // A refused body is read on while the client keeps up the uploads' minimum rate.
  const lingerRate = new MinRate(deps.uploadMinRate ?? MIN_RATE)
  const linger = new Lingers({ ...config.linger, ...deps.linger },
    (received, cut) => lingerRate.watchReceived(received, cut), clientAddressOf(config.trustProxy), {
      started: () => { deps.metrics.lingerStarted() },
      ended: (reason) => { deps.metrics.lingerEnded(reason) },
      cut: (cap, reqId) => { deps.logger?.info({ reqId, cap }, 'lingering connection cut to make room') }
    })
  const shedder = new LoadShedder()
  // One access line per request, also for a client that left (499) and the router's refusals.
  const accessLines = new AccessLines()
  const app = createFastify(config, deps, { lifecycle, linger, shedder, accessLines })
  setServerLimits(app, config)

  // 1. Every response, errors and 404s included, carries the request id.
  app.decorateRequest('userId', '')
  app.addHook('onRequest', (request, reply, done) => {
    reply.header(REQUEST_ID_HEADER, request.id)
    done()
  })
  // An answer that leaves body bytes unread, or comes while draining, ends its connection.
  closeConnectionsWhenNeeded(app, lifecycle, linger)
  // A linger holds no request: the server's close must not wait for a slow client's body.
  app.addHook('preClose', (done) => { linger.closeAll(); done() })
  installObservability(app, config, deps, accessLines)

  // 2. Errors: one handler, one catalogue.
  installErrorHandling(app)

  // 3. Public routes; the OpenAPI generator first, so it sees every route.
  await registerOpenApi(app)
  await app.register(livenessRoutes, { lifecycle })

  // 4. Bearer routes: the JWT hook before the body is read or any handler runs, then the per-user rate limit.
  await registerBearerRoutes(app, config, deps, shedder)
  return app
}

interface FrontParts { lifecycle: Lifecycle, linger: Lingers, shedder: LoadShedder, accessLines: AccessLines }

function createFastify (config: GatewayConfig, deps: AppDeps, front: FrontParts): FastifyInstance {
  const { lifecycle, linger, shedder, accessLines } = front
  const app = Fastify({
    // Load shedding stands in front of Fastify: a refusal must cost far less than an answer.
    serverFactory: (handler) => createFrontServer(handler, { shed: (req) => shedder.verdict(req), lifecycle, linger }),
    ...(deps.logger === undefined ? { logger: false } : { loggerInstance: deps.logger }),
    genReqId: requestIdFrom,
    requestIdHeader: false,
    logController: accessLines,
    // Each request's logger carries traceId beside reqId, and costs nothing until it writes.
    childLoggerFactory: requestLoggerFactory,
    // Requests on open keep-alive sockets are still served while draining; /health says 500.
    return503OnClosing: false,
    bodyLimit: SERVER_LIMITS.bodyLimitBytes,
    // X-Forwarded-For is believed only from TRUST_PROXY's peers (decision: TLS and HTTP/2 end at the load balancer).
    trustProxy: config.trustProxy === undefined ? false : [...config.trustProxy],
    // Requests the router cannot read bypass hooks and the error handler: answered here, without echoing the URL.
    clientErrorHandler: clientErrorAnswerer(linger, (status, code, reqId) => {
      app.log.warn({ reqId, status, code }, 'request refused by the HTTP parser')
    }),
    frameworkErrors (error, request, reply) {
      request.log.info({ code: error.code }, 'request rejected')
      ;(reply as FastifyReply).code(400).header(REQUEST_ID_HEADER, request.id).send({ error: 'malformed URL' })
    },
    // The reference engine's compiler configuration: no coercion (decision: strict JSON).
    ajv: SCHEMA_VALIDATION
  })
  return app
}

/** The server from serverFactory is ours: Fastify applies no timeouts to it. */
function setServerLimits (app: FastifyInstance, config: GatewayConfig): void {
  app.server.keepAliveTimeout = SERVER_LIMITS.keepAliveTimeoutMs
  app.server.requestTimeout = SERVER_LIMITS.requestTimeoutMs
  app.server.setTimeout(idleTimeoutMs(config))
  app.server.maxHeadersCount = SERVER_LIMITS.maxHeaderCount
  app.server.headersTimeout = SERVER_LIMITS.headersTimeoutMs
}

function installObservability (
  app: FastifyInstance, config: GatewayConfig, deps: AppDeps, accessLines: AccessLines
): void {
  installTraceContext(app, config.trustProxy)
  if (deps.tracing !== undefined) {
    const store = config.limits.redis === undefined ? 'memory' : 'redis'
    installTracing(app, deps.tracing, deps.engine, { store, trustProxy: config.trustProxy })
  }
  // With METRICS_PORT=0 nothing scrapes the per-request series, so the request path pays nothing for them.
  if (config.metricsPort !== 0) installRequestMetrics(app, deps.metrics)
  logEngineEvents(app, deps.engine)
  // The access line has a fixed shape and goes straight to the log's destination: no child logger, no object walk.
  accessLines.start(app.log)
}

async function registerBearerRoutes (
  app: FastifyInstance, config: GatewayConfig, deps: AppDeps, shedder: LoadShedder
): Promise<void> {
  const authenticate = await createAuthenticator(app, { jwt: config.jwt, keySet: deps.keySet })
  const callTimeoutMs = SERVER_LIMITS.requestTimeoutMs + config.upstreamTimeoutMs
  const limits = buildLimits(app, config.limits, { ...deps, shedder, callTimeoutMs })
  await app.register(async function bearerScope (api) {
    api.addHook('onRequest', authenticate)
    if (limits.rateLimit !== undefined) api.addHook('onRequest', limits.rateLimit)
    await api.register(async function invitedOnceAdmitted (routes) {
      // A refused client never sends its body: it is invited once admitted (decision: every answer has a shape).
      routes.addHook('onRequest', inviteBody)
      const probeTimeoutMs = Math.min(config.upstreamTimeoutMs, 2_000)
      await routes.register(engineHealthRoutes, { engine: deps.engine, probeTimeoutMs })
      await routes.register(portfolioRoutes, {
        prefix: '/portfolio',
        engine: deps.engine,
        idempotency: limits.idempotency,
        engineTimeoutMs: config.upstreamTimeoutMs
      })
    })
    // Create invites its body itself, once it will really stream: after its upload cap, key claim and connection.
    await api.register(createPortfolioRoutes, {
      prefix: '/portfolio',
      engine: deps.engine,
      idempotency: limits.idempotency,
      responseTimeoutMs: config.upstreamTimeoutMs,
      stallTimeoutMs: deps.uploadStallTimeoutMs ?? SERVER_LIMITS.uploadStallTimeoutMs,
      callTimeoutMs,
      // UPLOAD_MAX_CONNECTIONS is per engine endpoint; the set may grow or shrink with DNS.
      uploads: { ...config.uploads, endpoints: () => deps.engine.endpointCount(), shared: limits.uploadCount },
      ...(deps.uploadMinRate === undefined ? {} : { minRate: deps.uploadMinRate }),
      ...(deps.tracing === undefined ? {} : { uploadWaited: traceUploadWait })
    })
  }, { prefix: '/api' })
}
