/**
 * Per-user rate limit (DECISIONS 14): RATE_LIMIT_PER_MINUTE requests per token
 * `sub` per fixed 60 s window, all /api/* routes together. The hook runs after
 * the token is verified, so a 401 never counts and a flood of bad tokens costs
 * no store call.
 *
 * Headers: draft-ietf-httpapi-ratelimit-headers in its structured-field form,
 *   RateLimit-Policy: "default";q=600;w=60
 *   RateLimit: "default";r=42;t=17
 * on every counted answer, and Retry-After on the 429. @fastify/rate-limit 11
 * is not used: its `enableDraftSpec` emits the older `ratelimit-limit`,
 * `ratelimit-remaining`, `ratelimit-reset` fields, not these (docs/architecture.md,
 * "Packages, and why").
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
    // The in-process store counts synchronously: no promise on its path.
    if (hit instanceof Promise) hit.then(counted, failOpen)
    else counted(hit)

    function counted ({ count, resetMs }: WindowHit): void {
      const resetS = Math.max(1, Math.ceil(resetMs / 1000))
      reply.header('ratelimit-policy', policy)
      reply.header('ratelimit', `"default";r=${Math.max(0, perMinute - count)};t=${resetS}`)
      // The 429 is counted with the other refusals (gateway_rejections_total{reason="rate_limit"}).
      if (count > perMinute) return done(new GatewayError('RATE_LIMITED', undefined, { headers: { 'retry-after': String(resetS) } }))
      done()
    }
    function failOpen (err: unknown): void {
      // Fail open (DECISIONS 17): a store outage must not turn into an outage of the API.
      // Counted here; the store logs the outage once (warn), each request only at debug.
      metrics.rateLimitFailedOpen()
      request.log.debug({ err: { message: (err as Error).message } }, 'rate limit store unavailable: request let through')
      done()
    }
  }
}
