/**
 * Per-user rate limit (decision: rate limits), run after auth so a flood of bad tokens costs no store call. Headers
 * follow draft-ietf-httpapi-ratelimit-headers' structured-field form, which @fastify/rate-limit does not emit.
 */
import type { FastifyReply, FastifyRequest, onRequestHookHandler } from 'fastify'
import { GatewayError } from '../http/errors.js'
import type { LimitStore, WindowHit } from './store.js'
import type { LimitsMetrics } from '../observability/metrics.js'

export const RATE_WINDOW_S = 60

export function rateLimitHook (store: LimitStore, perMinute: number, metrics: LimitsMetrics): onRequestHookHandler {
  const policy = `"default";q=${perMinute};w=${RATE_WINDOW_S}`
  return function rateLimit (request: FastifyRequest, reply: FastifyReply, done: (err?: Error) => void): void {
    let hit: WindowHit | Promise<WindowHit>
    try {
      hit = store.hit(request.userId, RATE_WINDOW_S * 1000)
    } catch (err) {
      return failOpen(err)
    }
    if (hit instanceof Promise) hit.then(counted, failOpen)
    else counted(hit)

    function counted ({ count, resetMs }: WindowHit): void {
      const resetS = Math.max(1, Math.ceil(resetMs / 1000))
      reply.header('ratelimit-policy', policy)
      reply.header('ratelimit', `"default";r=${Math.max(0, perMinute - count)};t=${resetS}`)
      if (count > perMinute) {
        return done(new GatewayError('RATE_LIMITED', undefined, { headers: { 'retry-after': String(resetS) } }))
      }
      done()
    }
    function failOpen (err: unknown): void {
      // A store outage must not become an outage of the API (decision: shared state); the store logs it once.
      metrics.rateLimitFailedOpen()
      request.log.debug({ err: { message: (err as Error).message } }, 'rate limit store unavailable: ' +
        'request let through')
      done()
    }
  }
}
