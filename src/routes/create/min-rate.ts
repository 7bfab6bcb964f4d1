/**
 * The minimum-rate rule for uploads that hold an engine connection, or an
 * upload connection they were invited with (DECISIONS 23; Apache mod_reqtimeout's `MinRate` is the model): a client
 * that sends no byte for `stallMs` (10 s), or less than `bytesPerS` (4 KiB/s)
 * averaged over any `windowMs` (30 s), is cut off.
 *
 * Cheap per chunk: a chunk adds its length to a number. One ticker for all
 * uploads (running only while one is watched) closes a one-tick bucket per
 * upload and keeps the window's sum, so there is no timer per chunk and none
 * per upload. Ticks while the upload waits on the engine (a chunk handed over
 * and not yet taken: backpressure) do not count against the client, so a slow
 * engine is never blamed on the phone; the engine's own stall limit
 * (UploadClock) covers that.
 */
import { GatewayError } from '../../http/errors.js'

export interface MinRateOptions {
  /** No byte for this long: cut off (10 s). */
  stallMs: number
  /** The averaging window (30 s). */
  windowMs: number
  /** At least this many bytes per second over every window (4096). */
  bytesPerS: number
  /** Bucket width and check period (1 s); stallMs and windowMs are counted in whole ticks. */
  tickMs: number
}

export const MIN_RATE: MinRateOptions = { stallMs: 10_000, windowMs: 30_000, bytesPerS: 4096, tickMs: 1_000 }

/** One upload under watch: the upload's timing callbacks feed it. */
export class RateMeter {
  /** Bytes since the last tick. */
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

  /**
   * Count what the client's socket receives (an invited client's fields and
   * image head, read before anything is handed over), or stop (undefined):
   * handed-over chunks are counted from then on.
   */
  countReceived (received: (() => number) | undefined): void {
    this.#received = received
    this.#receivedSeen = received?.() ?? 0
  }

  /** Stop watching (the body has gone to the engine, or the upload ended). */
  stop (): void {
    this.#watch.unwatch(this)
  }

  /** One tick: the failure if the client broke the rule, else undefined. */
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

  /** Watch an upload from now; `cut` is called once if it breaks the rule. */
  watch (cut: (err: GatewayError) => void): RateMeter {
    const meter = new RateMeter(this, this.#buckets, cut)
    this.#meters.add(meter)
    if (this.#timer === undefined) {
      this.#timer = setInterval(() => this.#tick(), this.#opts.tickMs)
      this.#timer.unref()
    }
    return meter
  }

  /**
   * Watch what a socket receives (`received`, cumulative) rather than chunks handed over: `cut` once the
   * rule is broken. Returns the function that stops the watch.
   */
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
