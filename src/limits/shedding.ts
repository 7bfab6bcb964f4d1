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
 * flooded gateway out of trouble: the hook answers the 503 itself, with a
 * body serialised once, no error object and no stack, and logs one line per
 * second while shedding (with the count) instead of one per request.
 */
import type { FastifyReply, FastifyRequest, onRequestHookHandler } from 'fastify'
import { GatewayError, wireBody } from '../http/errors.js'
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

export function shedHook (signals: ShedSignals, metrics: LimitsMetrics): onRequestHookHandler {
  const body = JSON.stringify(wireBody(overloaded(), undefined))
  let shedSinceLine = 0
  let lineAt = -Infinity
  return function shed (request: FastifyRequest, reply: FastifyReply, done: (err?: Error) => void): void {
    const why = signals.eventLoop?.lagging() === true ? 'event loop' : signals.engineQueueFull() ? 'engine queue' : undefined
    if (why === undefined) return done()
    metrics.rejected('shed')
    shedSinceLine++
    const now = performance.now()
    if (now - lineAt >= 1000) {
      request.log.warn({ signal: why, shed: shedSinceLine }, 'shedding load: new /api/* requests get 503 (count since the last such line)')
      shedSinceLine = 0
      lineAt = now
    }
    // Answered here, not thrown: an unread body still closes the connection (src/http/connection-close.ts).
    void reply.code(503).header('retry-after', RETRY_AFTER_S).type('application/json; charset=utf-8').send(body)
  }
}

/** The 503 of an overloaded gateway (an unread body closes the connection: src/http/connection-close.ts). */
export function overloaded (): GatewayError {
  return new GatewayError('OVERLOADED', undefined, { headers: { 'retry-after': RETRY_AFTER_S } })
}
