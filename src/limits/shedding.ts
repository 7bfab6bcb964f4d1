/**
 * Load shedding (DECISIONS 15): a new /api/* request gets 503 with Retry-After
 * at once when the gateway cannot keep up, instead of waiting into a timeout.
 *
 * Two signals, both a cheap read per request:
 * - the engine pool's queue (EngineClient.queueFull: requests waiting for one
 *   of the pool's connections, bounded by UPSTREAM_MAX_QUEUE);
 * - the event loop's delay, from a timer due every 20 ms. A once-a-second
 *   mean (under-pressure's default) averages a stall away. Here the delay is
 *   read live: a request that arrives while the timer is overdue by more than
 *   the bound is refused, so a long turn of the loop (a CPU-bound flood: one
 *   poll phase reading a thousand sockets) refuses its tail instead of making
 *   it wait. After a stall, timers run before the sockets are read, so the
 *   late tick also marks the requests that piled up behind it; the state holds
 *   until the next on-time tick. (Holding longer made a single late tick, e.g.
 *   a process descheduled on a busy machine, refuse a whole second.)
 *
 * A refusal must cost much less than an answer, or refusing cannot get a
 * flooded gateway out of trouble: LoadShedder's verdict is answered in front
 * of Fastify (http/front.ts writes it), with a body serialised once, and it
 * logs one line per second while shedding (with the count) instead of one per
 * request.
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
 * Watch the event loop; `lagging()` is true while the timer is overdue by more
 * than `boundMs`, and from a tick that came that late to the next one on time.
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
  /** Undefined when SHED_EVENT_LOOP_DELAY_MS=0. */
  eventLoop?: EventLoopWatch
  engineQueueFull: () => boolean
}

/** The 503, serialised once: the body and headers front.ts writes for every refusal. */
const OVERLOADED_ANSWER: FrontAnswer = Object.freeze({ status: 503, body: JSON.stringify(wireBody(overloaded(), undefined)), headers: Object.freeze({ 'retry-after': RETRY_AFTER_S }) })

/**
 * Asked in front of Fastify on the HTTP server (Fastify's `serverFactory`), so
 * a refused request costs Node's parse and one write: no Fastify request and
 * reply, no child logger, no hooks, no access line. Only /api/* is ever shed,
 * as the router sees the path: `/%61pi/...` and `http://host/api/...` are
 * /api/* too (router-path.ts).
 * What it refuses is counted (gateway_rejections_total{reason="shed"}) and
 * logged as one warn line per second with the count.
 */
export class LoadShedder {
  #signals: ShedSignals | undefined
  #metrics: LimitsMetrics | undefined
  #log: FastifyBaseLogger | undefined
  #shedSinceLine = 0
  #lineAt = -Infinity

  /** Give it its signals once the app has them; until then nothing is shed. */
  arm (signals: ShedSignals, metrics: LimitsMetrics, log: FastifyBaseLogger): void {
    this.#signals = signals
    this.#metrics = metrics
    this.#log = log
  }

  /** The 503 to answer when overloaded; undefined: the request goes on. */
  verdict (req: IncomingMessage): FrontAnswer | undefined {
    const signals = this.#signals
    if (signals === undefined) return undefined
    const url = req.url ?? ''
    // The common case costs one startsWith; only an odd target is normalised.
    const path = url.startsWith('/api/') ? url : routerPath(url)
    if (path?.startsWith('/api/') !== true) return undefined
    const why = signals.eventLoop?.lagging() === true ? 'event loop' : signals.engineQueueFull() ? 'engine queue' : undefined
    if (why === undefined) return undefined
    this.#metrics!.rejected('shed')
    this.#shedSinceLine++
    const now = performance.now()
    if (now - this.#lineAt >= 1000) {
      this.#log!.warn({ signal: why, shed: this.#shedSinceLine }, 'shedding load: new /api/* requests get 503 (count since the last such line)')
      this.#shedSinceLine = 0
      this.#lineAt = now
    }
    return OVERLOADED_ANSWER
  }
}

/** The 503 of an overloaded gateway (an unread body closes the connection: src/http/connection-close.ts). */
export function overloaded (): GatewayError {
  return new GatewayError('OVERLOADED', undefined, { headers: { 'retry-after': RETRY_AFTER_S } })
}
