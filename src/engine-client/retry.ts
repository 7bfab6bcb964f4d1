/**
 * Whether to try again (decision: several engine endpoints): any call that provably never reached the engine (it failed
 * before onRequestStart, which undici calls right before the first byte); GETs also after a reset, a try's timeout or a
 * bad answer; never a POST whose bytes went out, since its outcome is unknown.
 */
import type { GatewayError } from '../http/errors.js'

export type RetryReason = 'unreachable' | 'reset' | 'try_timeout' | 'bad_response'
export const RETRY_REASONS: readonly RetryReason[] = ['unreachable', 'reset', 'try_timeout', 'bad_response']

export const MAX_RETRIES = 2
export const JITTER_MIN_MS = 25
export const JITTER_MAX_MS = 250
export const BUDGET_RATIO = 0.2
export const BUDGET_MIN = 3

/** An answer outside the upstream contract, by status and type alone (this runs on every answer). */
export function outsideContract (path: string, status: number, contentType: string): boolean {
  if (status >= 200 && status < 300) {
    return !contentType.startsWith(path === '/api/portfolio/ping' ? 'text/plain' : 'application/json')
  }
  return status < 400 || !contentType.startsWith('application/json')
}

/** Whether a finished try counts against its endpoint: never the engine's own structured 4xx or 500. */
export function isGatewayFailure (
  err: GatewayError | undefined,
  path: string,
  status: number,
  contentType: string
): boolean {
  return err !== undefined || status === 503 || outsideContract(path, status, contentType)
}

/** The reason to try again, or undefined; `sent`: bytes may have reached the engine. */
export function retryReason (
  method: string,
  sent: boolean,
  err: GatewayError | undefined,
  tryTimedOut: boolean,
  path: string,
  status: number,
  contentType: string
): RetryReason | undefined {
  if (err !== undefined) {
    if (!sent && err.code === 'UPSTREAM_UNAVAILABLE') return 'unreachable'
    if (method !== 'GET') return undefined
    if (tryTimedOut) return 'try_timeout'
    if (err.code === 'UPSTREAM_UNAVAILABLE') return 'reset'
    if (err.code === 'UPSTREAM_BAD_RESPONSE') return 'bad_response'
    return undefined
  }
  if (method !== 'GET') return undefined
  return status === 502 || status === 503 || outsideContract(path, status, contentType) ? 'bad_response' : undefined
}

/** Full jitter before the second retry and later (the first goes at once). */
export function jitterMs (random: () => number = Math.random): number {
  return JITTER_MIN_MS + Math.floor(random() * (JITTER_MAX_MS - JITTER_MIN_MS + 1))
}

/**
 * The retry budget: with it, retries in flight stay under 20% of the calls on their first try (3 always allowed),
 * which keeps them within 20% of all calls even when retried calls last longer.
 */
export class RetryBudget {
  calls = 0
  retries = 0
  allows (): boolean {
    const withThisOne = this.retries + 1
    return withThisOne <= BUDGET_MIN || withThisOne < BUDGET_RATIO * (this.calls - this.retries)
  }

  /** How many retries may be in flight now, those already in flight included (GET /status). */
  allowed (): number {
    return Math.max(BUDGET_MIN, Math.ceil(BUDGET_RATIO * (this.calls - this.retries)) - 1)
  }
}
