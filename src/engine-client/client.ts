/**
 * The gateway's only way to the engine: one undici Pool, every limit set here
 * (undici's defaults are 300 s timeouts and unlimited connections).
 *
 * Responses of the upstream contract are small JSON or text, and the gateway
 * must check their shape before answering (DECISIONS 8), so they are collected
 * into one Buffer, bounded by `maxResponseBytes`. Request bodies are never
 * buffered here: a stream or iterable is handed to undici as it is.
 */
import type { Readable } from 'node:stream'
import { Pool, type Dispatcher } from 'undici'
import { REQUEST_ID_HEADER, USER_ID_HEADER } from '../../schemas/upstream.js'
import { GatewayError, upstreamError } from '../http/errors.js'
import type { EngineCallName, EngineOutcome, EnginePoolState } from '../observability/metrics.js'
import { overloaded } from '../limits/shedding.js'

export interface EnginePoolOptions {
  url: string
  /** Response headers deadline for calls whose body is small (DECISIONS "Configuration"). */
  timeoutMs: number
  /** Sockets to the engine; requests beyond queue in the pool, not the kernel. */
  connections?: number
  /** Requests in flight per socket (RFC 9112 pipelining); 1 is the safe default. */
  pipelining?: number
  connectTimeoutMs?: number
  /** How long an idle keep-alive socket is kept; below the engine's own idle timeout. */
  keepAliveTimeoutMs?: number
  maxResponseBytes?: number
  /** Requests that may wait for a connection (UPSTREAM_MAX_QUEUE); past it a call is refused with 503 at once (DECISIONS 15). */
  maxQueue?: number
}

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
  /** Aborts the call; the reason (a GatewayError) is what the call rejects with. */
  signal?: AbortSignal
  /** From the call to the engine's response headers, queue included; default UPSTREAM_TIMEOUT_MS, 0 for none (streamed uploads keep their own clock). */
  responseTimeoutMs?: number
  /** Called once the engine's response headers are in (e.g. to stop an upload clock). */
  onResponseStart?: () => void
  /** undici's own headers timeout (from the request on a socket): a backstop; default UPSTREAM_TIMEOUT_MS. */
  headersTimeoutMs?: number
  /** W3C trace context for the engine (src/observability/trace-context.ts). */
  traceparent?: string
}

/**
 * Who is asking, as every engine call says it: the request id, the verified
 * subject (never a client header, DECISIONS 9) and the trace context.
 */
export function callerOf (request: { id: string, userId: string, traceparent: string }): Pick<EngineRequest, 'requestId' | 'userId' | 'traceparent'> {
  return { requestId: request.id, userId: request.userId, traceparent: request.traceparent }
}

/** Told of every finished call: the metrics' one hook into the engine client. */
export type EngineCallObserver = (call: EngineCallName, outcome: EngineOutcome, seconds: number) => void

/** The metrics label of each engine path: a fixed set, never the path itself. */
const CALL_NAMES: Readonly<Record<string, EngineCallName>> = {
  '/api/portfolio/ping': 'ping',
  '/api/portfolio/create': 'create',
  '/api/portfolio/update': 'update',
  '/health': 'health'
}

/**
 * What a finished call means (DECISIONS 8): a 2xx, the engine's own (JSON)
 * error, or how the call failed. Only the status and type are looked at here;
 * a 2xx whose body breaks the contract counts as ok, and answers.ts makes it a 502.
 */
function outcomeOf (err: GatewayError | undefined, status: number, contentType: string): EngineOutcome {
  if (err === undefined) {
    if (status >= 200 && status < 300) return 'ok'
    return status >= 400 && contentType.startsWith('application/json') ? 'engine_error' : 'bad_response'
  }
  if (err.code === 'UPSTREAM_TIMEOUT') return 'timeout'
  if (err.code === 'UPSTREAM_BAD_RESPONSE') return 'bad_response'
  return 'unavailable'
}

export interface EngineResponse {
  status: number
  contentType: string
  body: Buffer
}

type Controller = Parameters<NonNullable<Dispatcher.DispatchHandler['onRequestStart']>>[0]

export class EngineClient {
  readonly #pool: Pool
  readonly #timeoutMs: number
  readonly #maxResponseBytes: number
  #observer: EngineCallObserver | undefined
  readonly #maxQueue: number
  readonly #queued: () => number

  constructor (opts: EnginePoolOptions) {
    this.#timeoutMs = opts.timeoutMs
    this.#maxResponseBytes = opts.maxResponseBytes ?? 1024 * 1024
    this.#maxQueue = opts.maxQueue ?? 256
    const idleMs = opts.keepAliveTimeoutMs ?? 4_000
    this.#pool = new Pool(opts.url, {
      connections: opts.connections ?? 128,
      pipelining: opts.pipelining ?? 1,
      connect: { timeout: opts.connectTimeoutMs ?? 2_000 },
      // An idle pooled socket closes after this. undici would follow the engine's
      // `Keep-Alive: timeout=N` hint up to keepAliveMaxTimeout (default 600 s):
      // capped at the same value, the bound is ours whatever the engine says.
      keepAliveTimeout: idleMs,
      keepAliveMaxTimeout: idleMs,
      headersTimeout: opts.timeoutMs,
      bodyTimeout: opts.timeoutMs
    })
    // `pool.stats` builds a PoolStats that walks every connection (five getters,
    // 128 clients each): measured at 6-8% of the gateway's CPU when read per
    // request. The queued count itself is one field of the pool: read that.
    const queued = Object.getOwnPropertySymbols(this.#pool).find((s) => s.description === 'queued')
    const pool = this.#pool as unknown as Record<symbol, number>
    this.#queued = queued === undefined ? () => this.#pool.stats.queued : () => pool[queued]!
  }

  /** Report every finished call to `observer` (one at a time: the last one set wins). */
  observe (observer: EngineCallObserver): void {
    this.#observer = observer
  }

  /** Sockets connected, requests waiting for a socket, requests on a socket (undici Pool stats). */
  poolState (): EnginePoolState {
    const { connected, queued, running } = this.#pool.stats
    return { connected, queued, running }
  }

  /** True when as many calls wait for a connection as UPSTREAM_MAX_QUEUE allows: a cheap read of undici's counters. */
  queueFull (): boolean {
    return this.#queued() >= this.#maxQueue
  }

  /** Send one request and collect the engine's answer. Rejects with a GatewayError only. */
  call (req: EngineRequest): Promise<EngineResponse> {
    // An abort that came first never fires its event again: refuse at once, send nothing.
    if (req.signal?.aborted === true) return Promise.reject(upstreamError(req.signal.reason))
    // Past the bound the call would only wait into a timeout: refuse it now.
    if (this.queueFull()) return Promise.reject(overloaded())
    return new Promise<EngineResponse>((resolve, reject) => {
      const headers: Record<string, string> = { [REQUEST_ID_HEADER]: req.requestId }
      if (req.userId !== undefined) headers[USER_ID_HEADER] = req.userId
      if (req.contentType !== undefined) headers['content-type'] = req.contentType
      if (req.idempotencyKey !== undefined) headers['idempotency-key'] = req.idempotencyKey
      if (typeof req.body === 'string') headers['content-length'] = String(Buffer.byteLength(req.body))
      if (req.traceparent !== undefined) headers.traceparent = req.traceparent
      const observer = this.#observer
      const startedAt = observer === undefined ? 0 : performance.now()

      const max = this.#maxResponseBytes
      const chunks: Buffer[] = []
      let size = 0
      let status = 0
      let contentType = ''
      let controller: Controller | undefined
      /** Set once the call is given up on, possibly before undici took it off the pool's queue. */
      let failure: Error | undefined
      const giveUp = (err: Error): void => {
        failure ??= err
        if (controller !== undefined) controller.abort(failure)
        else finish(failure)
      }
      const signal = req.signal
      const onAbort = (): void => giveUp(signal?.reason as Error)
      signal?.addEventListener('abort', onAbort, { once: true })
      // DECISIONS 8 counts from the moment the gateway asks, queue included. undici's
      // own headersTimeout starts only on a socket and fires on a ~1 s grid.
      const deadlineMs = req.responseTimeoutMs ?? this.#timeoutMs
      const deadline = deadlineMs > 0 ? setTimeout(() => giveUp(new GatewayError('UPSTREAM_TIMEOUT')), deadlineMs) : undefined
      let settled = false
      function finish (err: Error | undefined, answer?: EngineResponse): void {
        if (settled) return
        settled = true
        clearTimeout(deadline)
        signal?.removeEventListener('abort', onAbort)
        const failed = err === undefined ? undefined : upstreamError(err)
        observer?.(CALL_NAMES[req.path] ?? 'other', outcomeOf(failed, status, contentType), (performance.now() - startedAt) / 1000)
        if (failed !== undefined) reject(failed)
        else resolve(answer!)
      }

      this.#pool.dispatch({
        method: req.method,
        path: req.path,
        headers,
        // undici documents AsyncIterable bodies for dispatch; its typings omit them.
        body: (req.body ?? null) as Dispatcher.DispatchOptions['body'],
        headersTimeout: req.headersTimeoutMs ?? this.#timeoutMs
      }, {
        onRequestStart (c) {
          controller = c
          if (failure !== undefined) c.abort(failure)
        },
        onResponseStart (_c, statusCode, resHeaders) {
          status = statusCode
          const type = resHeaders['content-type']
          contentType = typeof type === 'string' ? type : ''
          // Headers are in: from here undici's bodyTimeout watches the engine.
          clearTimeout(deadline)
          req.onResponseStart?.()
        },
        onResponseData (c, chunk) {
          size += chunk.length
          if (size > max) c.abort(new GatewayError('UPSTREAM_BAD_RESPONSE', undefined, { cause: new Error(`engine response exceeds ${max} bytes`) }))
          else chunks.push(chunk)
        },
        onResponseEnd () {
          finish(undefined, { status, contentType, body: chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size) })
        },
        onResponseError (_c, err) {
          finish(err)
        }
      })
    })
  }

  /** Wait for requests in flight, then close every socket. */
  close (): Promise<void> {
    return this.#pool.close()
  }
}
