/**
 * The verified-token cache. Keyed by the SHA-256 of the
 * token, not the token: an entry costs 43 characters of key whatever the
 * token's size (up to 16 KiB), so 10,000 entries stay under ~2 MB.
 * An entry never outlives the token's `exp` (plus the clock tolerance) nor
 * `maxAgeMs`.
 */
import { hash } from 'node:crypto'
import { LRUCache } from 'lru-cache'

export interface Verified<K> {
  readonly userId: string
  /** The key-set key that verified it (key-set mode): re-checked on every hit. */
  readonly key?: K
}

export class TokenCache<K = never> {
  /** Exposed for tests: its keys are hashes. */
  readonly lru: LRUCache<string, Verified<K>>
  private readonly maxAgeMs: number

  constructor (opts: { max?: number, maxAgeMs?: number } = {}) {
    this.lru = new LRUCache({ max: opts.max ?? 10_000 })
    this.maxAgeMs = opts.maxAgeMs ?? 5 * 60_000
  }

  static keyOf (token: string): string {
    return hash('sha256', token, 'base64url')
  }

  get (token: string): Verified<K> | undefined {
    return this.lru.get(TokenCache.keyOf(token))
  }

  /** `validUntilMs`: the moment the token stops being accepted (exp + tolerance). */
  set (token: string, entry: Verified<K>, validUntilMs: number): void {
    const ttl = Math.min(this.maxAgeMs, validUntilMs - Date.now())
    if (ttl > 0) this.lru.set(TokenCache.keyOf(token), entry, { ttl })
  }

  delete (token: string): void {
    this.lru.delete(TokenCache.keyOf(token))
  }
}
