/**
 * Where rate-limit counters and idempotency records live (DECISIONS 17):
 * in the process (MemoryStore) or in Redis (RedisStore). Both implement
 * LimitStore; every method may reject when the store cannot be reached.
 */
import type { StoreStatus } from '../observability/status.js'
export type { StoreStatus }

/**
 * The fixed windows are aligned to the clock (window n covers
 * [n * windowMs, (n + 1) * windowMs)), so every instance and both stores
 * agree on which window a request falls in and when it resets, with no
 * round trip to ask.
 */
export function currentWindow (windowMs: number, now = Date.now()): { id: number; resetMs: number } {
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

/**
 * An idempotency record: claimed and in flight, or the engine's stored answer.
 * A claim carries its owner, a random token only the request that claimed it
 * knows: `complete` and `release` act only while the record is still that
 * claim, so a request whose claim expired (or was evicted) and was taken by a
 * newer one cannot overwrite or delete the newer one's record.
 */
export type IdempotencyRecord =
  | { state: 'pending'; owner?: string; until?: number } |
  { state: 'done'; fingerprint: string; status: number; contentType: string; body: string /* base64 */ }

/**
 * A claim's owner token: the time its request may run until, then random
 * hex. Another request sees only that time (`pendingOf`), for its 409's Retry-After.
 */
export const ownerToken = (untilMs: number, random: string): string => `${untilMs}.${random}`

/** A pending record as another request sees it: when its request must be done, never its owner. */
export function pendingOf (owner: string | undefined): IdempotencyRecord {
  const until = Number(owner?.split('.', 1)[0])
  return Number.isFinite(until) ? { state: 'pending', until } : { state: 'pending' }
}

export interface LimitStore {
  /**
   * Count one request of `subject` in the current `windowMs` window
   * (currentWindow). The in-process store answers at once (no promise on the
   * hot path); Redis answers with a promise.
   */
  hit: (subject: string, windowMs: number) => WindowHit | Promise<WindowHit>
  /**
   * Claim `subject`'s `key` for `owner`, atomically. Resolves undefined when
   * this caller now holds it, else the record that holds it.
   */
  claim: (subject: string, key: string, owner: string, pendingTtlMs: number) => Promise<IdempotencyRecord | undefined>
  /** Replace `owner`'s claim with the finished answer, kept `ttlMs`. False (nothing written) when the claim is no
   * longer `owner`'s.
   */
  complete: (subject: string, key: string, owner: string, record: IdempotencyRecord, ttlMs: number) => Promise<boolean>
  /** Give `owner`'s claim up (the gateway's own error: nothing to store). False (nothing deleted) when it is no longer
   * `owner`'s.
   */
  release: (subject: string, key: string, owner: string) => Promise<boolean>
  /** The shared count of uploads in progress; undefined in the process (the upload share counts there). */
  readonly uploads?: UploadLeaseStore
  /** For GET /status. */
  status: () => StoreStatus
  close: () => Promise<void>
}

/**
 * Creates in progress, counted where every gateway sees them (DECISIONS 23
 * v2): each is a lease, an id with an expiry, held in the subject's own slot.
 * A gateway that dies mid-upload stops renewing its leases, and they expire
 * by themselves within `leaseMs`. Every method may reject when the store
 * cannot be reached; the caller then counts in the process.
 */
export interface UploadLeaseStore {
  /**
   * Take one of `subject`'s `max` places as `lease` for `leaseMs`: false when
   * all are held. `ended` are this gateway's leases of `subject` whose uploads
   * are over but whose leaveUpload has not been answered yet: they go first,
   * in the same step, so they never refuse this one.
   */
  enterUpload: (
    subject: string,
    lease: string,
    max: number,
    leaseMs: number,
    ended?: readonly string[]
  ) => Promise<boolean>
  /** Give `lease` back. */
  leaveUpload: (subject: string, lease: string) => Promise<void>
  /**
   * Extend every lease given that is still held to `leaseMs` from now; never
   * put one back (the call may run late, after its upload ended). Resolves to
   * the leases no longer held (an outage let them expire, or a restart lost them).
   */
  renewUploads: (
    leases: ReadonlyArray<{ subject: string; lease: string }>,
    leaseMs: number
  ) => Promise<Array<{ subject: string; lease: string }>>
}
