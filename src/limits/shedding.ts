/**
 * Load shedding (DECISIONS 15): a new /api/* request gets 503 with Retry-After
 * at once when the gateway cannot keep up, instead of waiting into a timeout.
 *
 * Two signals, both a cheap read per request:
 * - the engine pool's queue (EngineClient.queueFull: requests waiting for one
 *   of the pool's connections, bounded by UPSTREAM_MAX_QUEUE);
 * - the event loop's delay, sampled every 20 ms by a timer that measures how
 *   late it fires. A once-a-second mean (under-pressure's default) averages a
 *   stall away; a late tick sees it at the next turn of the loop, where timers
 *   run before the sockets are read. So the requests that piled up behind a
 *   stall past the bound are refused, and the state holds until the next
 *   on-time tick: a loop that stays slow keeps shedding, one that recovers
 *   serves again within 20 ms. (Holding longer made a single late tick, e.g.
 *   a process descheduled on a busy machine, refuse a whole second.)
 */
import type { FastifyReply, FastifyRequest, onRequestHookHandler } from 'fastify'
import { GatewayError } from '../http/errors.js'
import type { LimitsMetrics } from '../observability/metrics.js'

const SAMPLE_MS = 20
const RETRY_AFTER_S = '1'

export interface EventLoopWatch {
  readonly lagging: () => boolean
  readonly stop: () => void
}

/** Watch the event loop; `lagging()` is true from a tick late by more than `boundMs` to the next tick on time. */
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
    lagging: () => late,
    stop: () => clearInterval(timer)
  }
}

export interface ShedSignals {
  /** Undefined when SHED_EVENT_LOOP_DELAY_MS=0. */
  eventLoop?: EventLoopWatch
  engineQueueFull: () => boolean
}

export function shedHook (signals: ShedSignals, metrics: LimitsMetrics): onRequestHookHandler {

  return function shed (request: FastifyRequest, _reply: FastifyReply, done: (err?: Error) => void): void {
    const why = signals.eventLoop?.lagging() === true ? 'event loop' : signals.engineQueueFull() ? 'engine queue' : undefined
    if (why === undefined) return done()
    metrics.rejected('shed')
    request.log.warn({ signal: why }, 'shedding load')
    done(overloaded())
  }
}

/** The 503 of an overloaded gateway (an unread body closes the connection: src/http/connection-close.ts). */
export function overloaded (): GatewayError {
  return new GatewayError('OVERLOADED', undefined, { headers: { 'retry-after': RETRY_AFTER_S } })
}
