/**
 * Where rate-limit counters and idempotency records live (DECISIONS 17):
 * in the process (MemoryStore) or in Redis (RedisStore). Both implement
 * LimitStore; every method may reject when the store cannot be reached.
 */

/**
 * The fixed windows are aligned to the clock (window n covers
 * [n * windowMs, (n + 1) * windowMs)), so every instance and both stores
 * agree on which window a request falls in and when it resets, with no
 * round trip to ask.
 */
export function currentWindow (windowMs: number, now = Date.now()): { id: number, resetMs: number } {
  const id = Math.floor(now / windowMs)
  return { id, resetMs: (id + 1) * windowMs - now }
}

/** The state of one fixed 60 s window of one user. */
export interface WindowHit {
  /** Requests counted in this window, this one included. */
  count: number
  /** Milliseconds until the window resets. */
  resetMs: number
}

/** An idempotency record: claimed and in flight, or the engine's stored answer. */
export type IdempotencyRecord =
  | { state: 'pending' }
  | { state: 'done', fingerprint: string, status: number, contentType: string, body: string /* base64 */ }

export interface LimitStore {
  /**
   * Count one request in the current `windowMs` window of `key` (currentWindow).
   * The in-process store answers at once (no promise on the hot path); Redis
   * answers with a promise.
   */
  hit: (key: string, windowMs: number) => WindowHit | Promise<WindowHit>
  /** Claim `key` atomically. Resolves undefined when this caller now holds it, else the record that holds it. */
  claim: (key: string, pendingTtlMs: number) => Promise<IdempotencyRecord | undefined>
  /** Replace the claim with the finished answer, kept `ttlMs`. */
  complete: (key: string, record: IdempotencyRecord, ttlMs: number) => Promise<void>
  /** Give a claim up (the gateway's own error: nothing to store). */
  release: (key: string) => Promise<void>
  close: () => Promise<void>
}
