/**
 * Spans of an HTTP server, shared by the gateway (src/observability/tracing.ts)
 * and the reference engine: light enough to import when tracing is off (the
 * OpenTelemetry API and the W3C parser, never the SDK: see tracing-sdk.ts).
 */
import {
  createContextKey,
  ROOT_CONTEXT,
  SamplingDecision,
  SpanKind,
  trace,
  type Attributes,
  type Context,
  type SamplingResult,
  type Span,
  type Tracer
} from '@opentelemetry/api'
import { parseTraceParent } from '@opentelemetry/core'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import {
  ATTR_ERROR_TYPE,
  ATTR_HTTP_REQUEST_METHOD,
  ATTR_HTTP_RESPONSE_STATUS_CODE,
  ATTR_HTTP_ROUTE
} from '@opentelemetry/semantic-conventions'

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
export function startServerSpan (
  tracer: Tracer,
  method: string,
  route: string | undefined,
  parent: Context,
  attributes: Attributes = {}
): Span {
  attributes[ATTR_HTTP_REQUEST_METHOD] = method
  if (route !== undefined) attributes[ATTR_HTTP_ROUTE] = route
  return tracer.startSpan(
    route === undefined ? method : `${method} ${route}`,
    { kind: SpanKind.SERVER, attributes },
    parent
  )
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
    ;(request as SpannedRequest)[kSpan] = startServerSpan(
      tracer,
      request.method,
      request.routeOptions.url,
      remoteParent(request.headers.traceparent)
    )
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

/**
 * A decision made for the request before its span (Tracing.decide in
 * tracing-sdk.ts), which the span's sampling returns as it is. Here, not in the
 * SDK's module, so the request path can mark a recorded child without loading
 * the SDK when tracing is off.
 */
export const DECIDED = createContextKey('portfolio sampling decided')
const RECORDED: SamplingResult = { decision: SamplingDecision.RECORD_AND_SAMPLED }
/** The context a recorded new trace's server span starts in: one object for every such request. */
export const NEW_TRACE_RECORDED = ROOT_CONTEXT.setValue(DECIDED, RECORDED)

/**
 * A child of a recorded request's span (an engine try, a store operation) is
 * recorded too: the request's decision, not a new draw (`traceidratio` ignores
 * the parent, and an untrusted parent's request was decided on a random id).
 */
export function recordedChild (context: Context): Context {
  return context.setValue(DECIDED, RECORDED)
}
