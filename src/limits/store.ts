/** Where rate-limit counters and idempotency records live (decision: shared state); any method may reject. */
import type { StoreStatus } from '../observability/status.js'
export type { StoreStatus }

/** Windows are aligned to the clock so every instance agrees on a window and its reset without asking. */
export function currentWindow (windowMs: number, now = Date.now()): { id: number; resetMs: number } {
  const id = Math.floor(now / windowMs)
  return { id, resetMs: (id + 1) * windowMs - now }
}

export interface WindowHit {
  /** Requests counted in this window, this one included. */
  count: number
  resetMs: number
}

/**
 * A claim in flight, or the engine's stored answer. Only the claim's owner may complete or release it, so a request
 * whose claim expired and was taken over cannot overwrite the newer one's record.
 */
export type IdempotencyRecord =
  | { state: 'pending'; owner?: string; until?: number } |
  { state: 'done'; fingerprint: string; status: number; contentType: string; body: string /* base64 */ }

/** The time the claiming request may run until, then random hex; others see only the time, for a 409's Retry-After. */
export const ownerToken = (untilMs: number, random: string): string => `${untilMs}.${random}`

/** A pending record as another request sees it: when its request must be done, never its owner. */
export function pendingOf (owner: string | undefined): IdempotencyRecord {
  const until = Number(owner?.split('.', 1)[0])
  return Number.isFinite(until) ? { state: 'pending', until } : { state: 'pending' }
}

export interface LimitStore {
  /** Synchronous in the process, so the hot path makes no promise. */
  hit: (subject: string, windowMs: number) => WindowHit | Promise<WindowHit>
  /** Atomic: undefined when this caller now holds the key, else the record that holds it. */
  claim: (subject: string, key: string, owner: string, pendingTtlMs: number) => Promise<IdempotencyRecord | undefined>
  /** False, and nothing written, when the claim is no longer `owner`'s. */
  complete: (subject: string, key: string, owner: string, record: IdempotencyRecord, ttlMs: number) => Promise<boolean>
  /** False, and nothing deleted, when the claim is no longer `owner`'s. */
  release: (subject: string, key: string, owner: string) => Promise<boolean>
  /** Undefined in the process, where the upload share counts. */
  readonly uploads?: UploadLeaseStore
  status: () => StoreStatus
  close: () => Promise<void>
}

/**
 * Uploads in progress as leases every gateway sees (decision: uploads share the engine fairly); a gateway that dies
 * stops renewing, so its leases expire by themselves.
 */
export interface UploadLeaseStore {
  /** False when all places are held; `ended` (leases whose leave is still unanswered) are freed first, atomically. */
  enterUpload: (
    subject: string,
    lease: string,
    max: number,
    leaseMs: number,
    ended?: readonly string[]
  ) => Promise<boolean>
  leaveUpload: (subject: string, lease: string) => Promise<void>
  /** Extends only leases still held (the call may run late) and resolves to those no longer held. */
  renewUploads: (
    leases: ReadonlyArray<{ subject: string; lease: string }>,
    leaseMs: number
  ) => Promise<Array<{ subject: string; lease: string }>>
}
