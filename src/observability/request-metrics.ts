/** Per-request metrics, on series resolved when each route is added (series.ts), so a request pays additions only. */
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { toGatewayError } from '../http/error-handler.js'
import type { GatewayError } from '../http/errors.js'
import {
  GatewayMetrics, STATUS_CLASSES, type EngineMetricsSource, UNKNOWN_ROUTE, type RejectionReason
} from './metrics.js'
import type { CounterSeries, HistogramSeries } from './series.js'

/** An unmatched request's method outside these is labelled "other", so no client adds series. */
const KNOWN_METHODS = new Set(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'])

/** The gateway's own "too large" messages, for the body and the image. */
const TOO_LARGE = /must be at most \d+ bytes$/

/**
 * Why the gateway refused a request, or undefined for what is no refusal (404, 5xx). The load shedder counts its own
 * 503s, since other 503s are not shedding.
 */
export function rejectionReason (failure: GatewayError, statusCode: number | undefined): RejectionReason | undefined {
  switch (failure.code) {
    // Each upload refusal is its own reason: the per-user cap is a 429 that is not the rate limit.
    case 'TOO_MANY_UPLOADS': return 'upload_cap'
    case 'UPLOADS_BUSY': return 'upload_busy'
    case 'UPLOAD_TIMEOUT': return 'upload_slow'
  }
  if (statusCode === 429) return 'rate_limit'
  switch (failure.code) {
    case 'UNAUTHORIZED': return 'auth'
    case 'VALIDATION_ERROR': return TOO_LARGE.test(failure.message) ? 'body_too_large' : 'validation'
    default: return undefined
  }
}

/** Per status class: fast 401s and 429s must not hide slow 200s in one histogram. */
interface RouteSeries {
  count: CounterSeries[]
  duration: HistogramSeries[]
}

function seriesFor (metrics: GatewayMetrics, route: string, method: string): RouteSeries {
  return {
    count: STATUS_CLASSES.map((statusClass) => metrics.requests.series({ route, method, status_class: statusClass })),
    duration: STATUS_CLASSES.map((statusClass) =>
      metrics.requestDuration.series({ route, method, status_class: statusClass }))
  }
}

function record (series: RouteSeries, reply: FastifyReply): void {
  const statusClass = Math.floor(reply.statusCode / 100) - 1
  series.count[statusClass]?.inc()
  series.duration[statusClass]?.observe(reply.elapsedTime / 1000)
}

export function installRequestMetrics (app: FastifyInstance, metrics: GatewayMetrics): void {
  const leave = (): void => { metrics.inFlight-- }
  app.addHook('onRequest', (_request, reply, done) => {
    metrics.inFlight++
    // 'close' fires once for every response, also a client gone; `on` because `once` wraps the listener per request.
    reply.raw.on('close', leave)
    done()
  })

  // Labelled by the route template, never the URL the client sent.
  app.addHook('onRoute', (route) => {
    const byMethod = new Map<string, RouteSeries>()
    for (const method of [route.method].flat()) byMethod.set(method, seriesFor(metrics, route.url, method))
    const onResponse = (request: FastifyRequest, reply: FastifyReply, done: () => void): void => {
      const series = byMethod.get(request.method)
      if (series !== undefined) record(series, reply)
      done()
    }
    route.onResponse = [route.onResponse ?? []].flat().concat(onResponse)
  })
  const unmatched = new Map<string, RouteSeries>()
  app.addHook('onResponse', (request, reply, done) => {
    if (request.is404) {
      let series = unmatched.get(request.method)
      if (series === undefined) {
        const method = KNOWN_METHODS.has(request.method) ? request.method : 'other'
        unmatched.set(request.method, series = seriesFor(metrics, UNKNOWN_ROUTE, method))
      }
      record(series, reply)
    }
    done()
  })

  app.addHook('onError', (request, _reply, error: FastifyError, done) => {
    const reason = rejectionReason(toGatewayError(error, request), error.statusCode)
    if (reason !== undefined) metrics.rejected(reason)
    done()
  })
}

export interface ObservedMetrics { metrics: GatewayMetrics, stop: () => void }

/**
 * Metrics for one gateway and the engine client's observers. Per-call series only when something scrapes them; the
 * cluster's events are rare and counted always.
 */
export function observedMetrics (engine: EngineMetricsSource, opts: { perCall: boolean }): ObservedMetrics {
  const metrics = new GatewayMetrics({
    enginePool: () => engine.poolState(),
    engineEndpoints: () => engine.endpointStates()
  })
  const stop = engine.observeCluster({
    ejected: (endpoint) => { metrics.engineEjected(endpoint) },
    retried: (call, reason) => { metrics.engineRetried(call, reason) },
    budgetExhausted: () => { metrics.engineRetryBudgetSpent() },
    lookup: (name, error) => { if (error !== undefined) metrics.engineLookupFailed(name) }
  })
  engine.observeRemovals((endpoint) => { metrics.engineEndpointGone(endpoint) })
  if (opts.perCall) {
    engine.observe((call, outcome, seconds, endpoint) => metrics.engineCall(call, outcome, seconds, endpoint))
  }
  return { metrics, stop }
}
