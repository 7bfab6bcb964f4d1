/**
 * Whether to try again (DECISIONS 24, Envoy's retry state kept small).
 *
 * - Every call, POSTs included, when it provably never reached the engine:
 *   undici calls the handler's onRequestStart right before it writes the first
 *   byte of a request on a socket (client-h1.js writeH1), so a failure that
 *   comes before it (refused, connect timeout, no route, DNS, a socket closed
 *   while the request still waited for it) left nothing at the engine.
 * - GETs (ping, the health probe) also after a reset, a try's timeout, a
 *   502/503 or an answer outside the contract: they change nothing.
 * - Never a POST once its bytes went out, nor a create whose image began to
 *   stream: its outcome is unknown (the client retries with Idempotency-Key).
 *
 * At most 2 retries (1 with a single endpoint: the fresh-connection retry), full
 * jitter of 25-250 ms before the second, and a budget (RetryBudget).
 */
import type { GatewayError } from '../http/errors.js'

export type RetryReason = 'unreachable' | 'reset' | 'try_timeout' | 'bad_response'
export const RETRY_REASONS: readonly RetryReason[] = ['unreachable', 'reset', 'try_timeout', 'bad_response']

export const MAX_RETRIES = 2
export const JITTER_MIN_MS = 25
export const JITTER_MAX_MS = 250
export const BUDGET_RATIO = 0.2
export const BUDGET_MIN = 3

/**
 * An answer outside the upstream contract: a 2xx of the wrong type, an error
 * that is not the structured JSON shape, or a status the contract never uses.
 * Only status and type are read: this runs on every answer.
 */
export function outsideContract (path: string, status: number, contentType: string): boolean {
  if (status >= 200 && status < 300) {
    return !contentType.startsWith(path === '/api/portfolio/ping' ? 'text/plain' : 'application/json')
  }
  return status < 400 || !contentType.startsWith('application/json')
}

/**
 * Whether a finished try counts against its endpoint for outlier detection:
 * a failure of the gateway's call, an answer outside the contract, or a 503
 * of any shape; never the engine's own structured 4xx or 500.
 */
export function isGatewayFailure (
  err: GatewayError | undefined,
  path: string,
  status: number,
  contentType: string
): boolean {
  return err !== undefined || status === 503 || outsideContract(path, status, contentType)
}

/**
 * The reason to try again, or undefined. `sent`: onRequestStart was called
 * (bytes may have reached the engine). `tryTimedOut`: this try's own clock ran
 * out, not the call's.
 */
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
 * The retry budget: a retry is allowed when, with it, the retries in flight
 * stay under 20% of the calls in flight on their first try (3 are always
 * allowed). Counting against first tries, and counting the new retry itself,
 * keeps the retries as a count within 20% of the calls too, even when a
 * retried call lasts longer than one that is not (R < 0.2 (C - R) implies
 * R < 0.2 C; test/upstream-cluster.test.ts counts at the engines).
 * A retry after a failed connect is counted but never refused (call.ts): it
 * cost no engine anything.
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
