/**
 * Timing a streamed upload (issue: the upstream timeout measures the engine,
 * not the client). undici's own headersTimeout follows socket activity while
 * a body is written (re-armed on backpressure) and fires on a one-second grid;
 * streamed calls keep this explicit clock instead, whose meaning is exact:
 * - UPSTREAM_TIMEOUT_MS counts while the call waits for a pool connection
 *   (queue time counts, DECISIONS 8), and again from the moment the engine has
 *   the whole form;
 * - a separate, generous stall limit covers an engine that stops reading mid-upload;
 * - the clock stops for good at the engine's response headers: the response
 *   body is then watched by undici's bodyTimeout.
 * Either limit fires by aborting the engine call with a 504 reason.
 */
import { GatewayError } from '../../http/errors.js'
import type { UploadTiming } from './upload.js'

export class UploadClock implements UploadTiming {
  readonly #abort = new AbortController()
  readonly #responseTimeoutMs: number
  readonly #stallTimeoutMs: number
  #timer: NodeJS.Timeout | undefined
  #responded = false

  constructor (responseTimeoutMs: number, stallTimeoutMs: number) {
    this.#responseTimeoutMs = responseTimeoutMs
    this.#stallTimeoutMs = stallTimeoutMs
  }

  get signal (): AbortSignal {
    return this.#abort.signal
  }

  /** The call is made: until the engine takes the first bytes, it waits for a pool connection. */
  queued (): void {
    this.#arm(this.#responseTimeoutMs, 'portfolio engine timed out')
  }

  /** The engine's response headers are in: nothing re-arms the clock after this. */
  responded (): void {
    this.#responded = true
    this.stop()
  }

  handedOver (): void {
    this.#arm(this.#stallTimeoutMs, 'portfolio engine stopped reading the upload')
  }

  taken (): void {
    this.stop()
  }

  bodySent (): void {
    this.#arm(this.#responseTimeoutMs, 'portfolio engine timed out')
  }

  stop (): void {
    clearTimeout(this.#timer)
    this.#timer = undefined
  }

  #arm (ms: number, message: string): void {
    clearTimeout(this.#timer)
    if (this.#responded) return
    this.#timer = setTimeout(() => this.#abort.abort(new GatewayError('UPSTREAM_TIMEOUT', message)), ms)
  }
}
