/**
 * Per-request metrics: two hooks on the root instance, so every route, the
 * 404 handler and every error are seen. Per request: one gauge up and down, one
 * counter and one histogram observe; a rejection adds one more increment.
 */
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { toGatewayError } from '../http/error-handler.js'
import type { GatewayError } from '../http/errors.js'
import type { EngineClient } from '../engine-client/client.js'
import { GatewayMetrics, STATUS_CLASSES, UNKNOWN_ROUTE, type RejectionReason } from './metrics.js'

/** The gateway's own "too large" messages (src/shared/client-errors.ts, routes/create): body, image. */
const TOO_LARGE = /must be at most \d+ bytes$/

/**
 * Why the gateway refused a request, or undefined for failures that are not
 * refusals (404, 5xx). A 429 is the rate limit whatever raised it; a shed 503
 * is counted by the load shedder itself (`metrics.rejected('shed')`), since
 * other 503s (key set, shared store) are not shedding.
 */
export function rejectionReason (failure: GatewayError, statusCode: number | undefined): RejectionReason | undefined {
  if (statusCode === 429) return 'rate_limit'
  switch (failure.code) {
    case 'UNAUTHORIZED': return 'auth'
    case 'VALIDATION_ERROR': return TOO_LARGE.test(failure.message) ? 'body_too_large' : 'validation'
    default: return undefined
  }
}

export function installRequestMetrics (app: FastifyInstance, metrics: GatewayMetrics): void {
  const { requests, requestDuration, inFlight } = metrics

  app.addHook('onRequest', (request, reply, done) => {
    inFlight.inc()
    // 'close' fires for every response, also when the client went away before the answer.
    reply.raw.once('close', () => inFlight.dec())
    done()
  })

  app.addHook('onResponse', (request: FastifyRequest, reply: FastifyReply, done) => {
    // The route template ("/api/portfolio/update"), never the URL the client sent.
    const route = request.routeOptions.url ?? UNKNOWN_ROUTE
    const status = reply.statusCode
    requests.inc({ route, method: request.method, status_class: STATUS_CLASSES[Math.floor(status / 100) - 1] ?? 'other' })
    requestDuration.observe({ route, method: request.method }, reply.elapsedTime / 1000)
    done()
  })

  app.addHook('onError', (request, _reply, error: FastifyError, done) => {
    const reason = rejectionReason(toGatewayError(error, request), error.statusCode)
    if (reason !== undefined) metrics.rejected(reason)
    done()
  })
}

declare module 'fastify' {
  interface FastifyInstance {
    /** This app's metrics; server.ts serves them on METRICS_PORT. */
    metrics: GatewayMetrics
  }
}

/** Metrics for one app: its own registry, the request hooks, the engine client's observer. */
export function installMetrics (app: FastifyInstance, engine: EngineClient): GatewayMetrics {
  const metrics = new GatewayMetrics({ enginePool: () => engine.poolState() })
  engine.observe((call, outcome, seconds) => metrics.engineCall(call, outcome, seconds))
  installRequestMetrics(app, metrics)
  app.decorate('metrics', metrics)
  return metrics
}
