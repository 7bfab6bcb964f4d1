/**
 * What the engine client's parts and its users share: the request and answer
 * of one call, and the observers that metrics and tracing plug in. A file of
 * its own so that client.ts and call.ts both import it and not each other;
 * client.ts re-exports every name for the rest of the gateway.
 */
import type { Readable } from 'node:stream'
import type { EngineCallName, EngineOutcome } from '../observability/metrics.js'
import type { Abandonment } from '../http/client-gone.js'
import type { RetryReason } from './retry.js'

export interface EngineRequest {
  method: 'GET' | 'POST'
  path: string
  requestId: string
  userId?: string
  contentType?: string
  /** The client's Idempotency-Key, passed on bare so the engine can deduplicate too (DECISIONS 16). */
  idempotencyKey?: string
  /** Streams and async iterables are passed to undici as they are, never buffered. */
  body?: string | Buffer | Readable | AsyncIterable<Buffer>
  /**
   * Aborts the call; the reason (a GatewayError) is what the call rejects with.
   * Any reason but a timeout (UPSTREAM_TIMEOUT, AbortSignal.timeout) is the
   * client's doing: the try ends as `client_aborted` and never counts against
   * the engine (DECISIONS 23).
   */
  signal?: AbortSignal
  /**
   * The client went away: gives the call up (as `signal` does, counted as
   * `client_aborted`) only while none of its tries has begun writing to the
   * engine: waiting in a pool queue, connecting, or waiting to retry. A try
   * already being written goes on to its end and the call takes no retry
   * after it: cutting it off would leave the outcome of a POST unknown (an
   * update replaces positions whole), and costs the socket.
   */
  abandonIfQueued?: Abandonment
  /** From the call to the engine's response headers, queue included; default UPSTREAM_TIMEOUT_MS, 0 for none (streamed
   * uploads keep their own clock).
   */
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
