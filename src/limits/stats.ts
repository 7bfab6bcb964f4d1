/**
 * Counters of the limits layer, for logs and metrics (the observability
 * helper reads this object; it is plain numbers, never reset).
 */
export const limitsStats = {
  /** Requests answered 429 (DECISIONS 14). */
  rateLimited: 0,
  /** Requests let through because the counter store failed (fail open, DECISIONS 17). */
  rateLimitFailOpen: 0,
  /** Requests answered 503 because the event loop lagged or the engine queue was full (DECISIONS 15). */
  shedEventLoop: 0,
  shedEngineQueue: 0,
  /** Idempotency outcomes (DECISIONS 16). */
  idempotentReplays: 0,
  idempotencyConflicts: 0,
  /** Requests with an Idempotency-Key refused with 503 because the store failed (fail closed, DECISIONS 17). */
  idempotencyStoreFailures: 0,
  /** Store commands that failed (Redis down, timeout). */
  storeErrors: 0
}

export type LimitsStats = typeof limitsStats
