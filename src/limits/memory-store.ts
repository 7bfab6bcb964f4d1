/**
 * The in-process store, for one instance (decision: shared state). Each subject's records are capped, evicting its
 * own oldest, so one user sending fresh keys cannot push other users' records out of the shared LRU.
 */
import { LRUCache } from 'lru-cache'
import {
  currentWindow,
  pendingOf,
  type IdempotencyRecord,
  type LimitStore,
  type StoreStatus,
  type WindowHit
} from './store.js'

interface Window {
  id: number
  count: number
}
interface Stored {
  subject: string
  record: IdempotencyRecord
}

export interface MemoryStoreOptions {
  /** Windows and records, each; default 100,000. */
  maxEntries?: number
  /** Records one subject may hold; default 1,000. */
  maxRecordsPerSubject?: number
}

export class MemoryStore implements LimitStore {
  readonly #windows: LRUCache<string, Window>
  readonly #records: LRUCache<string, Stored>
  /** Each subject's record keys, oldest claim first. */
  readonly #bySubject = new Map<string, Set<string>>()
  readonly #perSubject: number

  constructor (opts: MemoryStoreOptions = {}) {
    const max = opts.maxEntries ?? 100_000
    this.#perSubject = opts.maxRecordsPerSubject ?? 1_000
    this.#windows = new LRUCache({ max })
    this.#records = new LRUCache({
      max,
      // 'set' is a record replaced under the same key, which the subject still holds.
      dispose: (stored, key, reason) => {
        if (reason !== 'set') this.#forget(stored.subject, key)
      }
    })
  }

  hit (subject: string, windowMs: number): WindowHit {
    const { id, resetMs } = currentWindow(windowMs)
    let w = this.#windows.get(subject)
    if (w === undefined || w.id !== id) {
      w = { id, count: 0 }
      this.#windows.set(subject, w, { ttl: resetMs })
    }
    w.count++
    return { count: w.count, resetMs }
  }

  async claim (
    subject: string,
    key: string,
    owner: string,
    pendingTtlMs: number
  ): Promise<IdempotencyRecord | undefined> {
    const id = recordId(subject, key)
    const held = this.#records.get(id)
    if (held !== undefined) return held.record.state === 'pending' ? pendingOf(held.record.owner) : held.record
    const keys = this.#bySubject.get(subject) ?? new Set<string>()
    for (const oldest of keys) {
      if (keys.size < this.#perSubject) break
      this.#records.delete(oldest)
      keys.delete(oldest) // in case the LRU had dropped it already
    }
    this.#records.set(id, { subject, record: { state: 'pending', owner } }, { ttl: pendingTtlMs })
    keys.add(id)
    this.#bySubject.set(subject, keys)
    return undefined
  }

  async complete (
    subject: string,
    key: string,
    owner: string,
    record: IdempotencyRecord,
    ttlMs: number
  ): Promise<boolean> {
    const id = recordId(subject, key)
    if (!this.#holds(id, owner)) return false
    this.#records.set(id, { subject, record }, { ttl: ttlMs })
    return true
  }

  async release (subject: string, key: string, owner: string): Promise<boolean> {
    const id = recordId(subject, key)
    if (!this.#holds(id, owner)) return false
    this.#records.delete(id)
    return true
  }

  status (): StoreStatus {
    return { mode: 'memory', state: 'up' }
  }

  async close (): Promise<void> {}

  #holds (id: string, owner: string): boolean {
    const held = this.#records.get(id)?.record
    return held?.state === 'pending' && held.owner === owner
  }

  #forget (subject: string, id: string): void {
    const keys = this.#bySubject.get(subject)
    if (keys === undefined) return
    keys.delete(id)
    if (keys.size === 0) this.#bySubject.delete(subject)
  }
}

/** Subject and key in one string, unambiguously (the subject's length first). */
function recordId (subject: string, key: string): string {
  return `${subject.length}:${subject}:${key}`
}
