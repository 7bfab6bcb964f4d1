/**
 * Spans of an HTTP server, shared by the gateway (src/observability/tracing.ts)
 * and the reference engine: light enough to import when tracing is off (the
 * OpenTelemetry API and the W3C parser, never the SDK: see tracing-sdk.ts).
 */
import { ROOT_CONTEXT, SpanKind, trace, type Attributes, type Context, type Span, type Tracer } from '@opentelemetry/api'
import { parseTraceParent } from '@opentelemetry/core'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import { ATTR_ERROR_TYPE, ATTR_HTTP_REQUEST_METHOD, ATTR_HTTP_RESPONSE_STATUS_CODE, ATTR_HTTP_ROUTE } from '@opentelemetry/semantic-conventions'

/**
 * The parent of a server span: the client's `traceparent` when valid
 * (W3C Trace Context), else none (a new trace).
 */
export function remoteParent (header: string | string[] | undefined): Context {
  if (typeof header !== 'string') return ROOT_CONTEXT
  const parent = parseTraceParent(header)
  return parent === null ? ROOT_CONTEXT : trace.setSpanContext(ROOT_CONTEXT, parent)
}

/** A server span as the HTTP semantic conventions name it: `{method} {route}`. */
export function startServerSpan (tracer: Tracer, method: string, route: string | undefined, parent: Context, attributes: Attributes = {}): Span {
  attributes[ATTR_HTTP_REQUEST_METHOD] = method
  if (route !== undefined) attributes[ATTR_HTTP_ROUTE] = route
  return tracer.startSpan(route === undefined ? method : `${method} ${route}`, { kind: SpanKind.SERVER, attributes }, parent)
}

/** The answer's status; a 5xx marks the span failed (a 4xx is the client's, per the conventions). */
export function endServerSpan (span: Span, statusCode: number): void {
  span.setAttribute(ATTR_HTTP_RESPONSE_STATUS_CODE, statusCode)
  if (statusCode >= 500) span.setStatus({ code: 2 })
  span.end()
}

/** `traceparent` for a span's own context: what a callee continues. */
export function traceparentOf (span: Span): string {
  const c = span.spanContext()
  return `00-${c.traceId}-${c.spanId}-0${(c.traceFlags & 1).toString()}`
}

const kSpan = Symbol('server span')
type SpannedRequest = FastifyRequest & { [kSpan]?: Span }

/**
 * A server span per request, continuing the caller's `traceparent` (the
 * reference engine: its spans nest under the gateway's try). Hooks are added
 * only when there is a tracer.
 */
export function traceRequests (app: FastifyInstance, tracer: Tracer): void {
  app.addHook('onRequest', (request, _reply, done) => {
    (request as SpannedRequest)[kSpan] = startServerSpan(tracer, request.method, request.routeOptions.url, remoteParent(request.headers.traceparent))
    done()
  })
  app.addHook('onResponse', (request, reply, done) => {
    const span = (request as SpannedRequest)[kSpan]
    if (span !== undefined && span.isRecording()) endServerSpan(span, reply.statusCode)
    done()
  })
  // The caller (the gateway, when its own client went away) closed the request first: the span still ends, and says so.
  app.addHook('onRequestAbort', (request, done) => {
    const span = (request as SpannedRequest)[kSpan]
    if (span !== undefined && span.isRecording()) {
      span.setAttribute(ATTR_ERROR_TYPE, 'client_aborted')
      span.end()
    }
    done()
  })
}
