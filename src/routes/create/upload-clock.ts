/**
 * Timing a streamed upload: the upstream timeout measures the engine, not
 * the client. undici's own headersTimeout follows socket activity while
 * a body is written (re-armed on backpressure) and fires on a one-second grid;
 * streamed calls keep this explicit clock instead, whose meaning is exact:
 * - UPSTREAM_TIMEOUT_MS counts while the call waits for a pool connection
 *   (queue time counts, DECISIONS 8), and again from the moment the engine has
 *   the whole form;
 * - a separate, generous stall limit covers an engine that stops reading mid-upload;
 * - the clock stops for good at the engine's response headers: the response
 *   body is then watched by undici's bodyTimeout.
 * Either limit fires by aborting the engine call with a 504 reason.
 *
 * The client is timed too, while its upload holds an engine connection: from
 * the first chunk handed to the engine (or, for a client invited with
 * `100 Continue`, from the invitation) to the last, the minimum-rate rule
 * (min-rate.ts, DECISIONS 23) watches the bytes; breaking it aborts the engine
 * call and hands the 408 to `cut`.
 */
import { GatewayError } from '../../http/errors.js'
import type { UploadTiming } from './upload.js'
import type { MinRate, RateMeter } from './min-rate.js'

export class UploadClock implements UploadTiming {
  readonly #abort = new AbortController()
  readonly #responseTimeoutMs: number
  readonly #stallTimeoutMs: number
  #timer: NodeJS.Timeout | undefined
  #responded = false
  #stopped = false
  readonly #rate: { watch: MinRate; cut: (err: GatewayError) => void } | undefined
  #meter: RateMeter | undefined
  #sending = false

  constructor (
    responseTimeoutMs: number,
    stallTimeoutMs: number,
    rate?: { watch: MinRate; cut: (err: GatewayError) => void }
  ) {
    this.#responseTimeoutMs = responseTimeoutMs
    this.#stallTimeoutMs = stallTimeoutMs
    this.#rate = rate
  }

  /**
   * Give the engine call up with `reason` (what the call then rejects with). The first reason stays.
   * The clock stops for good: a chunk the form still hands over afterwards arms nothing (a timer
   * left armed would hold the request's objects, and a closing process, for the stall limit).
   */
  abort (reason: GatewayError): void {
    this.stop()
    this.#abort.abort(reason)
  }

  /** The gateway refused the form mid-upload: the engine request is abandoned, the refusal its reason. */
  refused (err: GatewayError): void {
    this.abort(err)
  }

  get signal (): AbortSignal {
    return this.#abort.signal
  }

  /** The call is made: until the engine takes the first bytes, it waits for a pool connection. */
  queued (remainingMs = this.#responseTimeoutMs): void {
    this.#arm(remainingMs, 'portfolio engine timed out')
  }

  /** The engine's response headers are in: nothing re-arms the clock after this. */
  responded (): void {
    this.#responded = true
    this.stop()
  }

  /**
   * A client invited with `100 Continue` holds an upload connection from the
   * invitation: the rule runs from here, on the bytes its socket receives
   * (`received`, cumulative) until the first chunk is handed over.
   */
  invited (received: () => number): void {
    this.#startMeter()
    this.#meter?.countReceived(received)
  }

  handedOver (bytes: number): void {
    // A chunk undici pulled just before the engine's answer came (or the call ended) times nothing more:
    // the rest of the form, if it is still read, is watched on the socket (readingRest), never "on the engine".
    if (this.#responded || this.#stopped) return
    // The first chunk goes out once undici has a connection: the client holds it from here.
    this.#startMeter()
    const meter = this.#meter
    if (meter !== undefined) {
      meter.countReceived(undefined)
      meter.bytes += bytes
      meter.onEngine = true
    }
    this.#arm(this.#stallTimeoutMs, 'portfolio engine stopped reading the upload')
  }

  taken (): void {
    if (this.#meter !== undefined) this.#meter.onEngine = false
    clearTimeout(this.#timer)
    this.#timer = undefined
  }

  bodySent (): void {
    this.#stopMeter()
    this.#arm(this.#responseTimeoutMs, 'portfolio engine timed out')
  }

  /**
   * The engine has answered, but the rest of the form is still read (a keyed
   * create's fingerprint covers it all): the client is held to the minimum
   * rate while it sends it, counted on its socket's bytes. The engine's
   * timers stay stopped; stop() ends this watch too.
   */
  readingRest (received: () => number): void {
    if (this.#rate === undefined || this.#meter !== undefined) return
    this.#watchClient(this.#rate).countReceived(received)
  }

  /**
   * Stop for good: the call is over (or needs no more timing); nothing arms the clock again. Only
   * readingRest still starts a watch on the client afterwards: the engine has answered, and the rest
   * of a keyed form is read under the minimum rate, which is how a stalled client there is cut off.
   */
  stop (): void {
    this.#stopped = true
    this.#stopMeter()
    clearTimeout(this.#timer)
    this.#timer = undefined
  }

  #startMeter (): void {
    if (this.#sending || this.#rate === undefined || this.#responded || this.#stopped) return
    this.#sending = true
    this.#watchClient(this.#rate)
  }

  /** The minimum-rate watch on the client: breaking it aborts the engine call (a no-op once it has answered) and hands
   * the 408 to `cut`.
   */
  #watchClient (rate: { watch: MinRate; cut: (err: GatewayError) => void }): RateMeter {
    const meter = rate.watch.watch((err) => {
      this.#meter = undefined
      this.#abort.abort(err)
      rate.cut(err)
    })
    this.#meter = meter
    return meter
  }

  #stopMeter (): void {
    this.#meter?.stop()
    this.#meter = undefined
  }

  #arm (ms: number, message: string): void {
    clearTimeout(this.#timer)
    if (this.#responded || this.#stopped) return
    this.#timer = setTimeout(() => this.#abort.abort(new GatewayError('UPSTREAM_TIMEOUT', message)), ms)
  }
}
