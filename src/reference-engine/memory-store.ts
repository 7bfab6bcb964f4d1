/** The store in this process's memory, right for one engine. */
import type { TargetPosition } from '../../schemas/portfolio.js'
import { SERVICE_CONNECTED } from '../../schemas/upstream.js'
import {
  copyTargets, DEFAULT_KEY_TTL_S, freezePortfolio, type KeyRecord, type Portfolio, type PortfolioStore, type StoreState
} from './store.js'

const CONNECTED: StoreState = Object.freeze({ database: SERVICE_CONNECTED, cache: SERVICE_CONNECTED })

export interface MemoryPortfolioStoreOptions {
  keyTtlMs?: number
}

interface HeldKey {
  readonly record: KeyRecord
  readonly expiresAt: number
}

export class MemoryPortfolioStore implements PortfolioStore {
  readonly #portfolios = new Map<string, Portfolio>()
  /** Every record lives the same time, so insertion order is expiry order: expired records drop from the front. */
  readonly #byKey = new Map<string, HeldKey>()
  readonly #keyTtlMs: number

  constructor (opts: MemoryPortfolioStoreOptions = {}) {
    this.#keyTtlMs = opts.keyTtlMs ?? DEFAULT_KEY_TTL_S * 1000
  }

  async state (): Promise<StoreState> {
    return CONNECTED
  }

  /** For tests and tools in this process. */
  get size (): number {
    return this.#portfolios.size
  }

  /** For tests and tools in this process: any owner's portfolio. */
  get (id: string): Portfolio | undefined {
    return this.#portfolios.get(id)
  }

  async getOwned (id: string, owner: string): Promise<Portfolio | undefined> {
    const portfolio = this.#portfolios.get(id)
    return portfolio?.owner === owner ? portfolio : undefined
  }

  async insert (portfolio: Portfolio): Promise<void> {
    this.#insert(portfolio)
  }

  async createdWithKey (owner: string, key: string): Promise<KeyRecord | undefined> {
    return this.#liveKey(ownerKey(owner, key))
  }

  /** Check and insert with no await in between: one turn of the event loop, so atomic. */
  async insertOnce (portfolio: Portfolio, key: string, fingerprint: string): Promise<KeyRecord> {
    const prior = this.#liveKey(ownerKey(portfolio.owner, key))
    if (prior !== undefined) return prior
    this.#insert(portfolio)
    const record: KeyRecord = Object.freeze({ portfolioId: portfolio.id, fingerprint })
    this.#byKey.set(ownerKey(portfolio.owner, key), { record, expiresAt: performance.now() + this.#keyTtlMs })
    return record
  }

  async replaceTargets (id: string, owner: string, targets: readonly TargetPosition[]): Promise<boolean> {
    const portfolio = await this.getOwned(id, owner)
    if (portfolio === undefined) return false
    this.#portfolios.set(id, freezePortfolio({ ...portfolio, target_positions: copyTargets(targets) }))
    return true
  }

  async close (): Promise<void> {}

  /** The key's record unless it has expired; drops every expired record first. */
  #liveKey (id: string): KeyRecord | undefined {
    const now = performance.now()
    for (const [oldest, held] of this.#byKey) {
      if (held.expiresAt > now) break
      this.#byKey.delete(oldest)
    }
    return this.#byKey.get(id)?.record
  }

  #insert (portfolio: Portfolio): void {
    if (this.#portfolios.has(portfolio.id)) throw new Error(`portfolio ${portfolio.id} already exists`)
    this.#portfolios.set(portfolio.id, freezePortfolio(portfolio))
  }
}

const ownerKey = (owner: string, key: string): string => `${owner.length}:${owner}:${key}`
