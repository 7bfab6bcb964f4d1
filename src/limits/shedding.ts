/**
 * Load shedding (decision: load shedding): a new /api/* request gets 503 at once when the engine pool's queue is
 * full or the event loop is late, instead of waiting into a timeout. A refusal must cost far less than an answer, or
 * refusing cannot get a flooded gateway out of trouble.
 */
import type { IncomingMessage } from 'node:http'
import type { FastifyBaseLogger } from 'fastify'
import { GatewayError, wireBody } from '../http/errors.js'
import type { FrontAnswer } from '../http/front.js'
import { routerPath } from '../http/router-path.js'
import type { LimitsMetrics } from '../observability/metrics.js'

const SAMPLE_MS = 20
const RETRY_AFTER_S = '1'

export interface EventLoopWatch {
  readonly lagging: () => boolean
  readonly stop: () => void
}

/**
 * `lagging()` reads the delay live rather than a mean, which would average a stall away; a late tick holds until the
 * next on-time one, because requests that piled up behind a stall are read after the timers run.
 */
export function watchEventLoop (boundMs: number): EventLoopWatch {
  let expected = performance.now() + SAMPLE_MS
  let late = false
  const timer = setInterval(() => {
    const now = performance.now()
    late = now - expected > boundMs
    expected = now + SAMPLE_MS
  }, SAMPLE_MS)
  timer.unref()
  return {
    lagging: () => late || performance.now() - expected > boundMs,
    stop: () => clearInterval(timer)
  }
}

export interface ShedSignals {
  eventLoop?: EventLoopWatch
  engineQueueFull: () => boolean
}

const OVERLOADED_ANSWER: FrontAnswer = Object.freeze({
  status: 503,
  body: JSON.stringify(wireBody(overloaded(), undefined)),
  headers: Object.freeze({ 'retry-after': RETRY_AFTER_S })
})

/**
 * Asked in front of Fastify, so a refusal costs Node's parse and one write; it logs one line a second while shedding,
 * not one per request. Paths are judged as the router sees them, so `/%61pi/...` is /api/* too.
 */
export class LoadShedder {
  #signals: ShedSignals | undefined
  #metrics: LimitsMetrics | undefined
  #log: FastifyBaseLogger | undefined
  #shedSinceLine = 0
  #lineAt = -Infinity

  /** Until armed, nothing is shed. */
  arm (signals: ShedSignals, metrics: LimitsMetrics, log: FastifyBaseLogger): void {
    this.#signals = signals
    this.#metrics = metrics
    this.#log = log
  }

  /** Undefined: the request goes on. */
  verdict (req: IncomingMessage): FrontAnswer | undefined {
    const signals = this.#signals
    if (signals === undefined) return undefined
    const url = req.url ?? ''
    const path = url.startsWith('/api/') ? url : routerPath(url)
    if (path?.startsWith('/api/') !== true) return undefined
    const why = signals.eventLoop?.lagging() === true
      ? 'event loop'
      : signals.engineQueueFull() ? 'engine queue' : undefined
    if (why === undefined) return undefined
    this.#metrics!.rejected('shed')
    this.#shedSinceLine++
    const now = performance.now()
    if (now - this.#lineAt >= 1000) {
      this.#log!.warn({ signal: why, shed: this.#shedSinceLine },
        'shedding load: new /api/* requests get 503 (count since the last such line)')
      this.#shedSinceLine = 0
      this.#lineAt = now
    }
    return OVERLOADED_ANSWER
  }
}

export function overloaded (): GatewayError {
  return new GatewayError('OVERLOADED', undefined, { headers: { 'retry-after': RETRY_AFTER_S } })
}
