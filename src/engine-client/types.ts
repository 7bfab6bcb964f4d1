/** What the engine client's parts and users share: apart, so client.ts and call.ts need not import each other. */
import type { Readable } from 'node:stream'
import type { EngineCallName, EngineOutcome } from '../observability/metrics.js'
import type { Abandonment } from '../http/client-gone.js'
import type { RetryReason } from './retry.js'

/** A GET carries no body: the engine's GETs take none, and a timed-out GET may keep its socket (call.ts). */
export type EngineRequest = EngineRequestFields & ({ method: 'GET', body?: undefined } | { method: 'POST' })

interface EngineRequestFields {
  method: 'GET' | 'POST'
  path: string
  requestId: string
  userId?: string
  contentType?: string
  /** The client's Idempotency-Key, passed on bare so the engine can deduplicate too (decision: idempotency keys). */
  idempotencyKey?: string
  /** Streams and async iterables are passed to undici as they are, never buffered. */
  body?: string | Buffer | Readable | AsyncIterable<Buffer>
  /** Aborts the call with its reason; any reason but a timeout is the client's doing
   * (decision: uploads share the engine fairly).
   */
  signal?: AbortSignal
  /**
   * The client went away: gives the call up only while none of its tries has begun writing to the engine, since
   * cutting a POST off would leave its outcome unknown.
   */
  abandonIfQueued?: Abandonment
  /** From the call to the engine's headers, queue included; default UPSTREAM_TIMEOUT_MS, 0 for none (uploads). */
  responseTimeoutMs?: number
  /** Called once the engine's response headers are in (e.g. to stop an upload clock). */
  onResponseStart?: () => void
  /** undici's own headers timeout (from the request on a socket): a backstop; default UPSTREAM_TIMEOUT_MS. */
  headersTimeoutMs?: number
  /** W3C trace context for the engine (src/observability/trace-context.ts). */
  traceparent?: string
}

export interface EngineResponse {
  status: number
  contentType: string
  body: Buffer
  /** The engine's Retry-After header, as it sent it. */
  retryAfter?: string
}

export type { ClusterObserver, EngineCallObserver } from '../observability/metrics.js'

/** One try of a call, as a tracer sees it when the try starts. */
export interface EngineTryInfo {
  call: EngineCallName
  /** The call's request; request.traceparent is the gateway span's context. */
  request: EngineRequest
  /** The endpoint label as in metrics (host:port). */
  endpoint: string
  /** 1 for the first try, 2 for the first retry, ... */
  attempt: number
  /** Why this try is a retry; undefined on the first. */
  retryReason: RetryReason | undefined
}

export interface EngineTrySpan {
  /** If set, this try sends this traceparent header instead of request.traceparent. */
  traceparent?: string
  /** Called exactly once when the try ends (answer headers received and body read, or failure). */
  end: (outcome: EngineOutcome, statusCode: number | undefined) => void
}

export interface EngineTryObserver { startTry: (info: EngineTryInfo) => EngineTrySpan | undefined }

/** Where each endpoint stands and how much of the retry budget is in use: the status view's own type (GET /status). */
export type { EngineClusterStatus } from '../observability/status.js'
