/**
 * One try on one endpoint, as undici's dispatch handler. onRequestStart (right before the first byte) is the retry
 * policy's proof that a failed POST never reached the engine. A try given up while queued leaves undici's queue at
 * once, so it costs no socket; one that times out once sent keeps its socket until the engine answers, so a slow
 * engine gets no fresh connection in its place
 * (docs/decisions/0033-a-slow-endpoint-gets-no-more-connections-than-it-can-hold.md).
 */
import { createRequire } from 'node:module'
import type { Dispatcher } from 'undici'
import { GatewayError } from '../http/errors.js'
import type { Endpoint } from './endpoints.js'
import type { EngineTrySpan } from './types.js'

type Controller = Parameters<NonNullable<Dispatcher.DispatchHandler['onRequestStart']>>[0]

/**
 * undici's dispatch option through which a queue hands a waiting request the function that takes it out. Should a
 * later undici hide or drop it, a symbol of our own stands in: undici ignores it, and a try given up in a queue
 * then throws from onRequestStart instead (test/project/private-internals.test.ts fails first).
 */
export const kQueuedAbort: symbol = queuedAbortSymbol()

function queuedAbortSymbol (): symbol {
  try {
    const symbols = createRequire(import.meta.url)('undici/lib/core/symbols.js') as { kQueuedAbort?: unknown }
    if (typeof symbols.kQueuedAbort === 'symbol') return symbols.kQueuedAbort
  } catch {}
  return Symbol('queued abort: not found in undici')
}

/** How many call deadlines a timed-out try may hold its socket while the engine has not answered it. */
export const HOLD_DEADLINES = 3

export interface AttemptOwner {
  /** The try is over: `err` or a whole answer. Called once. */
  attemptEnded: (attempt: Attempt, err: Error | undefined) => void
  /** Headers are in (the route's onResponseStart). */
  attemptResponded: (attempt: Attempt) => void
  /** Asked as the try reaches a socket: true (and the try given up) when the call's deadline has passed. */
  tooLate: (attempt: Attempt) => boolean
}

/** The request body as undici pulls it, noting whether the source threw: the client's failure
 * (decision: uploads share the engine fairly).
 */
async function * watched (source: AsyncIterable<Buffer>, attempt: Attempt): AsyncGenerator<Buffer> {
  try {
    yield * source
  } catch (err) {
    attempt.bodyFailed = true
    throw err
  }
}

/** The engine took too long: the engine's doing, unlike every other reason to stop. */
export function isTimeout (err: Error): boolean {
  return err instanceof GatewayError && err.code === 'UPSTREAM_TIMEOUT'
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
  /** Takes the request out of the queue it waits in (undici's queued-abort hook); undefined once on a socket. */
  #cancelQueued: ((reason: Error) => void) | undefined = undefined
  /** A GET with a deadline (call.ts): a timeout holds its socket instead of destroying it. */
  holdable = false
  /** performance.now() as the request went on its socket. */
  sentAt = 0
  /** Timed out on its socket, which it keeps until the engine answers or undici's headersTimeout ends it. */
  #held = false
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

  /** undici's queued-abort hook: called as the request enters a queue (the pool's, then a connecting client's). */
  readonly queued = (cancel: (reason: Error) => void): void => {
    this.#cancelQueued = cancel
  }

  /** Give the try up, possibly before undici took it off the pool's queue. */
  giveUp (err: Error): void {
    this.#failure ??= err
    if (this.#controller !== undefined) {
      // Only while the answer's headers are awaited: once its body flows, a held try would read it uncounted.
      if (this.holdable && this.status === 0 && isTimeout(this.#failure)) this.#hold()
      else this.#controller.abort(this.#failure)
      return
    }
    // Out of the queue at once: undici calls onResponseError, which ends the try.
    this.#cancelQueued?.(this.#failure)
    if (this.#ended) return
    // Being handed to a socket right now: the call goes on; onRequestStart throws when undici gets there.
    if (this.poolQueued && !this.#abandoned && !this.#ended) {
      this.#abandoned = true
      this.endpoint.abandonedQueued++
    }
    this.end(this.#failure)
  }

  /** The engine keeps the request and this socket: a fresh one would only add to what it cannot answer. */
  #hold (): void {
    this.#held = true
    this.endpoint.held.set(this, performance.now())
    this.end(this.#failure)
  }

  /** Give up a held socket now (the client closes). */
  drop (): void {
    this.#controller?.abort(this.#failure ?? new GatewayError('UPSTREAM_TIMEOUT'))
  }

  #release (): void {
    this.#held = false
    this.endpoint.held.delete(this)
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
    // Past the deadline with its timer not yet run (a stalled loop runs I/O first): given up here, never sent.
    if (this.#failure === undefined) this.owner.tooLate(this)
    if (this.#failure !== undefined) {
      // Given up while queued: fail the request here, before a byte is written, and the socket stays.
      this.#leftQueue()
      throw this.#failure
    }
    this.#controller = c
    this.#cancelQueued = undefined
    this.sent = true
    this.sentAt = performance.now()
  }

  onResponseStart (_c: Controller, statusCode: number, headers: Record<string, string | string[] | undefined>): void {
    // An interim answer (102, 103) is not the answer: the deadline and a hold go on until the final headers.
    if (statusCode < 200 || this.#held) return
    this.status = statusCode
    const type = headers['content-type']
    this.contentType = typeof type === 'string' ? type : ''
    const retryAfter = headers['retry-after']
    this.retryAfter = typeof retryAfter === 'string' ? retryAfter : undefined
    // Headers are in: from here undici's bodyTimeout watches the engine.
    clearTimeout(this.timer)
    if (this.endpoint.held.size !== 0) this.endpoint.alive(this.sentAt)
    this.owner.attemptResponded(this)
  }

  onResponseData (c: Controller, chunk: Buffer): void {
    // A held try's late answer is dropped, but counted too: past the cap its socket goes.
    this.size += chunk.length
    if (this.size <= this.maxBytes) {
      if (!this.#held) this.chunks.push(chunk)
      return
    }
    const cause = new Error(`engine response exceeds ${this.maxBytes} bytes`)
    c.abort(new GatewayError('UPSTREAM_BAD_RESPONSE', undefined, { cause }))
  }

  onResponseEnd (): void {
    if (this.#held) this.#release()
    this.end(undefined)
  }

  onResponseError (_c: Controller, err: Error): void {
    if (this.#held) this.#release()
    this.#cancelQueued = undefined
    this.#leftQueue()
    this.end(err)
  }

  body (): Buffer {
    return this.chunks.length === 1 ? this.chunks[0]! : Buffer.concat(this.chunks, this.size)
  }
}
