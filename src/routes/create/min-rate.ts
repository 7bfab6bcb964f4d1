/**
 * The minimum rate for an upload that holds an engine connection (decision: uploads share the engine fairly),
 * modelled on Apache mod_reqtimeout's `MinRate`. One ticker for all uploads closes a bucket per upload, so a
 * chunk costs an addition and no upload has a timer of its own; ticks spent on the engine's backpressure do not
 * count against the client.
 */
import { GatewayError } from '../../http/errors.js'

export interface MinRateOptions {
  stallMs: number
  windowMs: number
  bytesPerS: number
  /** Bucket width and check period: stallMs and windowMs are counted in whole ticks. */
  tickMs: number
}

export const MIN_RATE: MinRateOptions = { stallMs: 10_000, windowMs: 30_000, bytesPerS: 4096, tickMs: 1_000 }

export class RateMeter {
  bytes = 0
  /** A chunk is with the engine connection (handed over, not yet taken). */
  onEngine = false
  /** Before any chunk is handed over: the bytes the client's socket has read so far, sampled each tick. */
  #received: (() => number) | undefined
  #receivedSeen = 0
  readonly #buckets: Float64Array
  #next = 0
  #ticks = 0
  #windowSum = 0
  #idleTicks = 0
  readonly #watch: MinRate
  readonly #cut: (err: GatewayError) => void

  constructor (watch: MinRate, buckets: number, cut: (err: GatewayError) => void) {
    this.#watch = watch
    this.#buckets = new Float64Array(buckets)
    this.#cut = cut
  }

  /** Before any chunk is handed over, an invited client's progress is what its socket receives. */
  countReceived (received: (() => number) | undefined): void {
    this.#received = received
    this.#receivedSeen = received?.() ?? 0
  }

  stop (): void {
    this.#watch.unwatch(this)
  }

  tick (opts: MinRateOptions, minWindowBytes: number, stallTicks: number): GatewayError | undefined {
    if (this.onEngine) return undefined
    if (this.#received !== undefined) {
      const received = this.#received()
      this.bytes += received - this.#receivedSeen
      this.#receivedSeen = received
    }
    const bytes = this.bytes
    this.bytes = 0
    this.#windowSum += bytes - this.#buckets[this.#next]!
    this.#buckets[this.#next] = bytes
    this.#next = (this.#next + 1) % this.#buckets.length
    this.#ticks++
    this.#idleTicks = bytes === 0 ? this.#idleTicks + 1 : 0
    if (this.#idleTicks >= stallTicks) {
      return tooSlow(`upload stalled: no byte for ${opts.stallMs / 1000} s`)
    }
    // The first tick is partial (the watch began mid-tick): judge only whole windows.
    if (this.#ticks > this.#buckets.length && this.#windowSum < minWindowBytes) {
      return tooSlow(`upload too slow: under ${opts.bytesPerS} bytes/s over ${opts.windowMs / 1000} s`)
    }
    return undefined
  }

  fail (err: GatewayError): void {
    this.#cut(err)
  }
}

/** 408 with `connection: close`: the rest of the body will not be read into an engine request. */
function tooSlow (message: string): GatewayError {
  return new GatewayError('UPLOAD_TIMEOUT', message, { headers: { connection: 'close' } })
}

export class MinRate {
  readonly #opts: MinRateOptions
  readonly #meters = new Set<RateMeter>()
  readonly #buckets: number
  readonly #minWindowBytes: number
  readonly #stallTicks: number
  #timer: NodeJS.Timeout | undefined

  constructor (opts: MinRateOptions = MIN_RATE) {
    this.#opts = opts
    this.#buckets = Math.max(1, Math.round(opts.windowMs / opts.tickMs))
    this.#minWindowBytes = opts.bytesPerS * opts.windowMs / 1000
    this.#stallTicks = Math.max(1, Math.ceil(opts.stallMs / opts.tickMs))
  }

  watch (cut: (err: GatewayError) => void): RateMeter {
    const meter = new RateMeter(this, this.#buckets, cut)
    this.#meters.add(meter)
    if (this.#timer === undefined) {
      this.#timer = setInterval(() => this.#tick(), this.#opts.tickMs)
      this.#timer.unref()
    }
    return meter
  }

  /** A refused body read on to its end is held to the same rule, on its socket's bytes. */
  watchReceived (received: () => number, cut: () => void): () => void {
    const meter = this.watch(() => { cut() })
    meter.countReceived(received)
    return () => { meter.stop() }
  }

  unwatch (meter: RateMeter): void {
    this.#meters.delete(meter)
    if (this.#meters.size === 0 && this.#timer !== undefined) {
      clearInterval(this.#timer)
      this.#timer = undefined
    }
  }

  /** Uploads under watch now (tests, metrics). */
  get size (): number {
    return this.#meters.size
  }

  #tick (): void {
    for (const meter of this.#meters) {
      const failure = meter.tick(this.#opts, this.#minWindowBytes, this.#stallTicks)
      if (failure === undefined) continue
      this.unwatch(meter)
      meter.fail(failure)
    }
  }
}
