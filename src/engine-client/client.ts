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
  /** undici's own headers timeout (from the request on a socket): a backstop; default UPSTREAM_TIMEOUT_MS. */
  headersTimeoutMs?: number
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
  readonly #maxQueue: number

  constructor (opts: EnginePoolOptions) {
    this.#timeoutMs = opts.timeoutMs
    this.#maxResponseBytes = opts.maxResponseBytes ?? 1024 * 1024
    this.#maxQueue = opts.maxQueue ?? 256
    this.#pool = new Pool(opts.url, {
      connections: opts.connections ?? 128,
      pipelining: opts.pipelining ?? 1,
      connect: { timeout: opts.connectTimeoutMs ?? 2_000 },
      keepAliveTimeout: opts.keepAliveTimeoutMs ?? 4_000,
      keepAliveMaxTimeout: 60_000,
      headersTimeout: opts.timeoutMs,
      bodyTimeout: opts.timeoutMs
    })
  }

  /** True when as many calls wait for a connection as UPSTREAM_MAX_QUEUE allows: a cheap read of undici's counters. */
  queueFull (): boolean {
    return this.#pool.stats.queued >= this.#maxQueue
  }

  /** Send one request and collect the engine's answer. Rejects with a GatewayError only. */
  call (req: EngineRequest): Promise<EngineResponse> {
    // Past the bound the call would only wait into a timeout: refuse it now.
    if (this.queueFull()) return Promise.reject(overloaded())
    return new Promise<EngineResponse>((resolve, reject) => {
      const headers: Record<string, string> = { [REQUEST_ID_HEADER]: req.requestId }
      if (req.userId !== undefined) headers[USER_ID_HEADER] = req.userId
      if (req.contentType !== undefined) headers['content-type'] = req.contentType
      if (req.idempotencyKey !== undefined) headers['idempotency-key'] = req.idempotencyKey
      if (typeof req.body === 'string') headers['content-length'] = String(Buffer.byteLength(req.body))

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
        if (err !== undefined) reject(upstreamError(err))
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
