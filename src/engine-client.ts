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
import { GatewayError, upstreamError } from './errors.js'

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
}

export interface EngineRequest {
  method: 'GET' | 'POST'
  path: string
  requestId: string
  userId?: string
  contentType?: string
  /** Streams and async iterables are passed to undici as they are, never buffered. */
  body?: string | Buffer | Readable | AsyncIterable<Buffer>
  /** Aborts the call; the reason (a GatewayError) is what the call rejects with. */
  signal?: AbortSignal
  /** Override the response headers deadline; 0 disables it (streamed uploads keep their own clock). */
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

  constructor (opts: EnginePoolOptions) {
    this.#timeoutMs = opts.timeoutMs
    this.#maxResponseBytes = opts.maxResponseBytes ?? 1024 * 1024
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

  /** Send one request and collect the engine's answer. Rejects with a GatewayError only. */
  call (req: EngineRequest): Promise<EngineResponse> {
    return new Promise<EngineResponse>((resolve, reject) => {
      const headers: Record<string, string> = { 'x-request-id': req.requestId }
      if (req.userId !== undefined) headers['x-user-id'] = req.userId
      if (req.contentType !== undefined) headers['content-type'] = req.contentType
      if (typeof req.body === 'string') headers['content-length'] = String(Buffer.byteLength(req.body))

      const max = this.#maxResponseBytes
      const chunks: Buffer[] = []
      let size = 0
      let status = 0
      let contentType = ''
      let controller: Controller | undefined
      const signal = req.signal
      const onAbort = (): void => controller?.abort(signal?.reason)
      const done = (): void => signal?.removeEventListener('abort', onAbort)

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
          if (signal === undefined) return
          if (signal.aborted) c.abort(signal.reason)
          else signal.addEventListener('abort', onAbort, { once: true })
        },
        onResponseStart (_c, statusCode, resHeaders) {
          status = statusCode
          const type = resHeaders['content-type']
          contentType = typeof type === 'string' ? type : ''
        },
        onResponseData (c, chunk) {
          size += chunk.length
          if (size > max) c.abort(new GatewayError('UPSTREAM_BAD_RESPONSE', undefined, { cause: new Error(`engine response exceeds ${max} bytes`) }))
          else chunks.push(chunk)
        },
        onResponseEnd () {
          done()
          resolve({ status, contentType, body: chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size) })
        },
        onResponseError (_c, err) {
          done()
          reject(upstreamError(err))
        }
      })
    })
  }

  /** Wait for requests in flight, then close every socket. */
  close (): Promise<void> {
    return this.#pool.close()
  }
}
