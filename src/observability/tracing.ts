/**
 * The gateway's spans (decision: traces), installed only when an OTLP endpoint is configured:
 *
 *   server span   `{method} {route}`, one per request, continuing the client's traceparent
 *   ├─ client span `{method} {engine path}`, one per engine try
 *   ├─ client span `idempotency claim|complete|release`, a keyed request's store work
 *   └─ internal span `upload connection wait`, a create's turn for an upload connection
 *
 * Never a token, a subject, a key or a body. An unsampled request costs the sampler's decision and nothing else.
 */
import {
  ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, type Context, type Span, type SpanContext, type Tracer
} from '@opentelemetry/api'
import { parseTraceParent } from '@opentelemetry/core'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import {
  ATTR_DB_OPERATION_NAME, ATTR_DB_SYSTEM_NAME, ATTR_ERROR_TYPE, ATTR_HTTP_REQUEST_HEADER, ATTR_HTTP_REQUEST_METHOD,
  ATTR_HTTP_REQUEST_RESEND_COUNT, ATTR_HTTP_RESPONSE_STATUS_CODE, ATTR_SERVER_ADDRESS, ATTR_SERVER_PORT, ATTR_URL_PATH
} from '@opentelemetry/semantic-conventions'
import { REQUEST_ID_HEADER } from '../../schemas/upstream.js'
import type { Tracing } from '../shared/tracing-sdk.js'
import { endServerSpan, recordedChild, startServerSpan, traceparentOf } from '../shared/tracing-spans.js'
import { toGatewayError } from '../http/error-handler.js'
import type { EngineCallName, EngineOutcome } from './metrics.js'
import { clientTraceParent, setTraceparent, traceIdOf, trustedPeers, type TraceParent } from './trace-context.js'

/** A sampled request's trace: its server span and what its children need. */
export interface RequestTrace {
  readonly span: Span
  readonly tracer: Tracer
  readonly context: Context
  readonly store: 'redis' | 'memory'
}

declare module 'fastify' {
  interface FastifyRequest {
    /** Set only on a sampled request while tracing is on. */
    trace: RequestTrace | undefined
  }
}

/** Names of this gateway's own attributes (no semantic convention exists for them). */
export const ATTR = {
  attempt: 'portfolio.engine.attempt',
  retryReason: 'portfolio.engine.retry_reason',
  outcome: 'portfolio.engine.outcome',
  call: 'portfolio.engine.call',
  uploadWaitMs: 'portfolio.upload.wait_ms'
} as const

const REQUEST_ID_ATTR = ATTR_HTTP_REQUEST_HEADER(REQUEST_ID_HEADER)

/** As much of the engine client's per-try observer as a span needs: the client, a layer above, satisfies it. */
export interface TryInfo {
  call: EngineCallName
  request: { method: string, path: string, traceparent?: string }
  endpoint: string
  attempt: number
  retryReason: string | undefined
}
export interface TrySpan {
  traceparent?: string
  end: (outcome: EngineOutcome, statusCode: number | undefined) => void
}
interface TryObservable { observeTries: (observer: { startTry: (info: TryInfo) => TrySpan | undefined }) => void }

export interface TracingInstallOptions {
  store: 'redis' | 'memory'
  /** TRUST_PROXY's addresses and CIDRs: the peers whose sampled flag is followed. */
  trustProxy?: readonly string[] | undefined
}

/** The server span's hooks, installed right after installTraceContext, and the engine client's per-try spans. */
export function installTracing (
  app: FastifyInstance, tracing: Tracing, engine: TryObservable, opts: TracingInstallOptions
): void {
  const { tracer } = tracing
  const trusted = trustedPeers(opts.trustProxy)
  app.decorateRequest('trace', undefined)
  app.addHook('onRequest', (request, reply, done) => {
    const span = startRequestSpan(request, tracing, trusted)
    if (span === undefined) return done()
    request.trace = { span, tracer, context: trace.setSpan(recordedChild(ROOT_CONTEXT), span), store: opts.store }
    // The engine-bound header carries this span's id and its sampled flag.
    setTraceparent(request.raw, traceparentOf(span))
    endWhenClientLeaves(reply.raw, span)
    done()
  })
  app.addHook('onError', (request, _reply, error, done) => {
    request.trace?.span.setAttribute(ATTR_ERROR_TYPE, toGatewayError(error, request).code)
    done()
  })
  app.addHook('onResponse', (request, reply, done) => {
    const t = request.trace
    if (t !== undefined && t.span.isRecording()) endServerSpan(t.span, reply.statusCode)
    done()
  })
  engine.observeTries({ startTry: (info) => startTrySpan(tracer, info) })
}

/**
 * The request's server span, or undefined when it is not sampled. The span, the engine and the log lines share the
 * one trace id trace-context.ts parsed or made.
 */
function startRequestSpan (
  request: FastifyRequest, tracing: Tracing, trusted: (address: string | undefined) => boolean
): Span | undefined {
  const client = clientTraceParent(request.raw)
  const followed = client !== undefined && trusted(request.socket.remoteAddress)
    ? trace.setSpanContext(ROOT_CONTEXT, spanContextOf(client))
    : ROOT_CONTEXT
  // Anyone else's request is decided as a new trace is: a gateway-made id by the ratio sampler, as everywhere; a
  // client's id, which the client picked, by a random draw (tracing-sdk.ts, decide).
  const traceId = traceIdOf(request.raw)
  const decided = tracing.decide(followed, client === undefined ? traceId : undefined)
  if (decided === undefined) {
    // The engine follows the gateway's decision, not the client's flag: a sampled engine-bound header means recorded.
    if (client !== undefined && request.traceparent.endsWith('01')) {
      setTraceparent(request.raw, `${request.traceparent.slice(0, 53)}00`)
    }
    return undefined
  }
  // A recorded request from outside TRUST_PROXY still continues its client's trace (not its decision).
  const parent = client !== undefined && followed === ROOT_CONTEXT
    ? trace.setSpanContext(decided, spanContextOf(client))
    : decided
  // A new trace gets the id its log lines already carry.
  if (client === undefined) tracing.nextTraceId = traceId
  const span = startServerSpan(tracing.tracer, request.method, request.routeOptions.url, parent)
  tracing.nextTraceId = undefined
  span.setAttribute(REQUEST_ID_ATTR, [request.id])
  return span
}

/**
 * A client gone before the answer still ends the span, saying so. Watched on the response of recorded requests
 * only: onRequestAbort would add a listener to every request, and misses a client that sent its whole body.
 */
function endWhenClientLeaves (res: FastifyReply['raw'], span: Span): void {
  res.once('close', () => {
    if (!res.writableFinished && span.isRecording()) {
      span.setAttribute(ATTR_ERROR_TYPE, 'client_aborted')
      span.end()
    }
  })
}

/** A client span for one engine try, under the server span its traceparent names; none for an unsampled request. */
export function startTrySpan (tracer: Tracer, info: TryInfo): TrySpan | undefined {
  const header = info.request.traceparent
  // Only a recorded request's header is sampled (installTracing).
  if (header === undefined || (header.charCodeAt(54) & 1) === 0) return undefined
  const parent = parseTraceParent(header)
  if (parent === null) return undefined
  const { host, port } = hostPort(info.endpoint)
  const span = tracer.startSpan(`${info.request.method} ${info.request.path}`, {
    kind: SpanKind.CLIENT,
    attributes: {
      [ATTR_HTTP_REQUEST_METHOD]: info.request.method,
      [ATTR_URL_PATH]: info.request.path,
      [ATTR_SERVER_ADDRESS]: host,
      ...(port === undefined ? {} : { [ATTR_SERVER_PORT]: port }),
      [ATTR.call]: info.call,
      [ATTR.attempt]: info.attempt,
      ...(info.attempt > 1 ? { [ATTR_HTTP_REQUEST_RESEND_COUNT]: info.attempt - 1 } : {}),
      ...(info.retryReason === undefined ? {} : { [ATTR.retryReason]: info.retryReason })
    }
  }, trace.setSpanContext(recordedChild(ROOT_CONTEXT), parent))
  if (!span.isRecording()) return undefined
  return {
    traceparent: traceparentOf(span),
    end: (outcome, statusCode) => {
      if (statusCode !== undefined && statusCode > 0) span.setAttribute(ATTR_HTTP_RESPONSE_STATUS_CODE, statusCode)
      span.setAttribute(ATTR.outcome, outcome)
      if (outcome !== 'ok') {
        span.setAttribute(ATTR_ERROR_TYPE, outcome === 'engine_error' ? String(statusCode) : outcome)
        if (outcome !== 'engine_error' || (statusCode ?? 500) >= 500) span.setStatus({ code: SpanStatusCode.ERROR })
      }
      span.end()
    }
  }
}

function spanContextOf (parent: TraceParent): SpanContext {
  return { traceId: parent.traceId, spanId: parent.parentId, traceFlags: parseInt(parent.flags, 16), isRemote: true }
}

/** "host:port" or "[v6]:port". */
function hostPort (endpoint: string): { host: string, port: number | undefined } {
  const colon = endpoint.lastIndexOf(':')
  if (colon === -1 || endpoint.endsWith(']')) return { host: endpoint, port: undefined }
  const host = endpoint.slice(0, colon)
  return { host: host.startsWith('[') ? host.slice(1, -1) : host, port: Number(endpoint.slice(colon + 1)) }
}

/** A span for one idempotency store operation; undefined unless the request is sampled. */
export function startStoreSpan (
  request: FastifyRequest,
  operation: 'claim' | 'complete' | 'release'
): Span | undefined {
  const t = request.trace
  if (t === undefined) return undefined
  return t.tracer.startSpan(`idempotency ${operation}`, {
    kind: t.store === 'redis' ? SpanKind.CLIENT : SpanKind.INTERNAL,
    attributes: { [ATTR_DB_SYSTEM_NAME]: t.store === 'redis' ? 'redis' : 'memory', [ATTR_DB_OPERATION_NAME]: operation }
  }, t.context)
}

/** End a store span; a failure gets its error type (the class name: a message may quote a key). */
export function endStoreSpan (span: Span | undefined, err?: unknown): void {
  if (span === undefined) return
  if (err !== undefined) {
    span.setAttribute(ATTR_ERROR_TYPE, err instanceof Error ? err.name : 'error')
    span.setStatus({ code: SpanStatusCode.ERROR })
  }
  span.end()
}

/** The time a create waited for an upload connection, from `askedAt` (performance.now()) to now. */
export function traceUploadWait (request: FastifyRequest, askedAt: number): void {
  const t = request.trace
  if (t === undefined) return
  const attributes = { [ATTR.uploadWaitMs]: performance.now() - askedAt }
  const span = t.tracer.startSpan('upload connection wait', { startTime: askedAt, attributes }, t.context)
  span.end()
}
