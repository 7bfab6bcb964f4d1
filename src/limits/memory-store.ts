/**
 * The in-process store: right for one instance (DECISIONS 17). Bounded: the
 * least recently used entries go first, and every entry has its TTL.
 */
import { LRUCache } from 'lru-cache'
import { currentWindow, type IdempotencyRecord, type LimitStore, type WindowHit } from './store.js'

interface Window { id: number, count: number }

export class MemoryStore implements LimitStore {
  readonly #windows: LRUCache<string, Window>
  readonly #records: LRUCache<string, IdempotencyRecord>

  constructor (opts: { maxEntries?: number } = {}) {
    const max = opts.maxEntries ?? 100_000
    this.#windows = new LRUCache({ max })
    this.#records = new LRUCache({ max })
  }

  hit (key: string, windowMs: number): WindowHit {
    const { id, resetMs } = currentWindow(windowMs)
    let w = this.#windows.get(key)
    if (w === undefined || w.id !== id) {
      w = { id, count: 0 }
      this.#windows.set(key, w, { ttl: resetMs })
    }
    w.count++
    return { count: w.count, resetMs }
  }

  async claim (key: string, pendingTtlMs: number): Promise<IdempotencyRecord | undefined> {
    const held = this.#records.get(key)
    if (held !== undefined) return held
    this.#records.set(key, { state: 'pending' }, { ttl: pendingTtlMs })
    return undefined
  }

  async complete (key: string, record: IdempotencyRecord, ttlMs: number): Promise<void> {
    this.#records.set(key, record, { ttl: ttlMs })
  }

  async release (key: string): Promise<void> {
    this.#records.delete(key)
  }

  async close (): Promise<void> {}
}
