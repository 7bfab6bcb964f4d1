/** Verified tokens, keyed by the token's SHA-256 so an entry's key is small whatever the token's size. */
import { hash } from 'node:crypto'
import { LRUCache } from 'lru-cache'

export interface Verified<K> {
  readonly userId: string
  /** The key-set key that verified it (key-set mode): re-checked on every hit. */
  readonly key?: K
}

export class TokenCache<K = never> {
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

  /** `validUntilMs` is exp plus the clock tolerance. */
  set (token: string, entry: Verified<K>, validUntilMs: number): void {
    const ttl = Math.min(this.maxAgeMs, validUntilMs - Date.now())
    if (ttl > 0) this.lru.set(TokenCache.keyOf(token), entry, { ttl })
  }

  delete (token: string): void {
    this.lru.delete(TokenCache.keyOf(token))
  }
}
