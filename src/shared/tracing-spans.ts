/** Server spans for the gateway and the reference engine, light enough to import when tracing is off (no SDK). */
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

export function remoteParent (header: string | string[] | undefined): Context {
  if (typeof header !== 'string') return ROOT_CONTEXT
  const parent = parseTraceParent(header)
  return parent === null ? ROOT_CONTEXT : trace.setSpanContext(ROOT_CONTEXT, parent)
}

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

/** Only a 5xx marks the span failed: a 4xx is the client's, per the conventions. */
export function endServerSpan (span: Span, statusCode: number): void {
  span.setAttribute(ATTR_HTTP_RESPONSE_STATUS_CODE, statusCode)
  if (statusCode >= 500) span.setStatus({ code: 2 })
  span.end()
}

export function traceparentOf (span: Span): string {
  const c = span.spanContext()
  return `00-${c.traceId}-${c.spanId}-0${(c.traceFlags & 1).toString()}`
}

const kSpan = Symbol('server span')
type SpannedRequest = FastifyRequest & { [kSpan]?: Span }

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
  // A span whose caller closed first still ends, and says so.
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
 * A sampling decision made before the span, returned as it is; here, not in the SDK's module, so the request path
 * can mark a recorded child without loading the SDK.
 */
export const DECIDED = createContextKey('portfolio sampling decided')
const RECORDED: SamplingResult = { decision: SamplingDecision.RECORD_AND_SAMPLED }
export const NEW_TRACE_RECORDED = ROOT_CONTEXT.setValue(DECIDED, RECORDED)

/** A recorded request's children are recorded too, not drawn anew (`traceidratio` ignores the parent). */
export function recordedChild (context: Context): Context {
  return context.setValue(DECIDED, RECORDED)
}
