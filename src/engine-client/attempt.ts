/**
 * One try of an engine call on one endpoint: undici's dispatch handler. It
 * collects the answer (small JSON or text, bounded by maxResponseBytes) and
 * records whether undici began writing the request (onRequestStart, called in
 * client-h1.js right before the first byte goes on the socket): the retry
 * policy's proof that a failed POST never reached the engine.
 */
import type { Dispatcher } from 'undici'
import { GatewayError } from '../http/errors.js'
import type { Endpoint } from './endpoints.js'

type Controller = Parameters<NonNullable<Dispatcher.DispatchHandler['onRequestStart']>>[0]

export interface AttemptOwner {
  /** The try is over: `err` or a whole answer. Called once. */
  attemptEnded: (attempt: Attempt, err: Error | undefined) => void
  /** Headers are in (the route's onResponseStart). */
  attemptResponded: (attempt: Attempt) => void
}

export class Attempt implements Dispatcher.DispatchHandler {
  sent = false
  status = 0
  contentType = ''
  chunks: Buffer[] = []
  size = 0
  /** This try's own clock ran out (a GET's per-try timeout). */
  tryTimedOut = false
  #controller: Controller | undefined = undefined
  #failure: Error | undefined = undefined
  #ended = false
  timer: NodeJS.Timeout | undefined = undefined

  constructor (readonly owner: AttemptOwner, readonly endpoint: Endpoint, readonly maxBytes: number) {}

  /** Give the try up, possibly before undici took it off the pool's queue. */
  giveUp (err: Error): void {
    this.#failure ??= err
    if (this.#controller !== undefined) this.#controller.abort(this.#failure)
    else this.end(this.#failure)
  }

  end (err: Error | undefined): void {
    if (this.#ended) return
    this.#ended = true
    clearTimeout(this.timer)
    this.owner.attemptEnded(this, err)
  }

  onRequestStart (c: Controller): void {
    this.#controller = c
    if (this.#failure !== undefined) c.abort(this.#failure)
    else this.sent = true
  }

  onResponseStart (_c: Controller, statusCode: number, headers: Record<string, string | string[] | undefined>): void {
    this.status = statusCode
    const type = headers['content-type']
    this.contentType = typeof type === 'string' ? type : ''
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
    this.end(err)
  }

  body (): Buffer {
    return this.chunks.length === 1 ? this.chunks[0]! : Buffer.concat(this.chunks, this.size)
  }
}
