/**
 * One try of an engine call on one endpoint: undici's dispatch handler. It
 * collects the answer (small JSON or text, bounded by maxResponseBytes) and
 * records whether undici began writing the request (onRequestStart, called in
 * client-h1.js right before the first byte goes on the socket): the retry
 * policy's proof that a failed POST never reached the engine.
 *
 * A try given up before that point (a per-try timeout, the deadline, the
 * client gone while it waits in its endpoint's pool queue; DECISIONS 24)
 * ends at once for the call, and leaves undici's queue without costing a
 * socket. undici 7 has no way to take a dispatched request out of a Pool's
 * queue, and aborting one when it reaches a socket destroys that socket
 * (client-h1.js writeH1's abort), even before a byte is written. But a handler
 * that throws from onRequestStart has its request failed and dropped with the
 * socket left as it was (writeH1 catches around request.onConnect; _resume
 * then splices the request out and goes on with the next): so a given-up try
 * throws there. test/engine-client/queue-leave.test.ts counts the engine's
 * connections to hold undici to it.
 */
import type { Dispatcher } from 'undici'
import { GatewayError } from '../http/errors.js'
import type { Endpoint } from './endpoints.js'
import type { EngineTrySpan } from './types.js'

type Controller = Parameters<NonNullable<Dispatcher.DispatchHandler['onRequestStart']>>[0]

export interface AttemptOwner {
  /** The try is over: `err` or a whole answer. Called once. */
  attemptEnded: (attempt: Attempt, err: Error | undefined) => void
  /** Headers are in (the route's onResponseStart). */
  attemptResponded: (attempt: Attempt) => void
  /** Asked as the try reaches a socket: true (and the try given up) when the call's deadline has passed. */
  tooLate: (attempt: Attempt) => boolean
}

/**
 * The request body as undici pulls it, with a note of whether the source
 * itself threw (the gateway refused the form, the client left or was cut off):
 * that failure is the client's, never the engine's (DECISIONS 23). Errors
 * of the socket do not pass through here: undici ends the loop that pulls,
 * which returns the generator without throwing into it.
 */
async function * watched (source: AsyncIterable<Buffer>, attempt: Attempt): AsyncGenerator<Buffer> {
  try {
    yield * source
  } catch (err) {
    attempt.bodyFailed = true
    throw err
  }
}

export class Attempt implements Dispatcher.DispatchHandler {
  sent = false
  status = 0
  contentType = ''
  /** The engine's Retry-After, passed on with the 503 it came with. */
  retryAfter: string | undefined = undefined
  chunks: Buffer[] = []
  size = 0
  /** This try's own clock ran out (a GET's per-try timeout). */
  tryTimedOut = false
  /** The request body's source threw: the client's doing, not the engine's. */
  bodyFailed = false
  /** Waiting in the pool's own queue when dispatched: given up there, it is not counted as queued any more. */
  poolQueued = false
  /** The tracer's span of this try, if one is observing. */
  span: EngineTrySpan | undefined = undefined
  /** A dispatcher of this try alone (a fresh connection), closed when the try ends. */
  own: Dispatcher | undefined = undefined
  #controller: Controller | undefined = undefined
  #failure: Error | undefined = undefined
  #ended = false
  /** Counted in its endpoint's abandonedQueued until undici reaches it. */
  #abandoned = false
  timer: NodeJS.Timeout | undefined = undefined

  constructor (readonly owner: AttemptOwner, readonly endpoint: Endpoint, readonly maxBytes: number) {}

  /** The request body to hand undici: streams and iterables watched (see `watched`). */
  bodyOf (body: unknown): unknown {
    if (body === undefined || body === null || typeof body === 'string' || Buffer.isBuffer(body)) return body ?? null
    return watched(body as AsyncIterable<Buffer>, this)
  }

  /** Give the try up, possibly before undici took it off the pool's queue. */
  giveUp (err: Error): void {
    this.#failure ??= err
    if (this.#controller !== undefined) {
      this.#controller.abort(this.#failure)
      return
    }
    // Not on a socket yet: the call goes on now; undici drops the request when it reaches one.
    if (this.poolQueued && !this.#abandoned && !this.#ended) {
      this.#abandoned = true
      this.endpoint.abandonedQueued++
    }
    this.end(this.#failure)
  }

  end (err: Error | undefined): void {
    if (this.#ended) return
    this.#ended = true
    clearTimeout(this.timer)
    this.owner.attemptEnded(this, err)
    if (this.own !== undefined) this.own.close().catch(() => {})
  }

  #leftQueue (): void {
    if (!this.#abandoned) return
    this.#abandoned = false
    this.endpoint.abandonedQueued--
  }

  onRequestStart (c: Controller): void {
    // Past the deadline while it waited for a socket, its timer not yet run (a stalled event loop runs
    // I/O before late timers): given up here, never sent.
    if (this.#failure === undefined) this.owner.tooLate(this)
    if (this.#failure !== undefined) {
      // Given up while queued: fail the request here, before a byte is written, and the socket stays.
      this.#leftQueue()
      throw this.#failure
    }
    this.#controller = c
    this.sent = true
  }

  onResponseStart (_c: Controller, statusCode: number, headers: Record<string, string | string[] | undefined>): void {
    this.status = statusCode
    const type = headers['content-type']
    this.contentType = typeof type === 'string' ? type : ''
    const retryAfter = headers['retry-after']
    this.retryAfter = typeof retryAfter === 'string' ? retryAfter : undefined
    // Headers are in: from here undici's bodyTimeout watches the engine.
    clearTimeout(this.timer)
    this.owner.attemptResponded(this)
  }

  onResponseData (c: Controller, chunk: Buffer): void {
    this.size += chunk.length
    if (this.size > this.maxBytes) c.abort(new GatewayError('UPSTREAM_BAD_RESPONSE', undefined, { cause: new Error(`engine response exceeds ${this.maxBytes} bytes`) }))
    else this.chunks.push(chunk)
  }

  onResponseEnd (): void {
    this.end(undefined)
  }

  onResponseError (_c: Controller, err: Error): void {
    this.#leftQueue()
    this.end(err)
  }

  body (): Buffer {
    return this.chunks.length === 1 ? this.chunks[0]! : Buffer.concat(this.chunks, this.size)
  }
}
