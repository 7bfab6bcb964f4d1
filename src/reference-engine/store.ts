/**
 * The reference engine's in-memory store. It stands in for the database and
 * cache of a real engine, so it also reports their state for GET /health.
 */
import type { CreatePortfolioFields, TargetPosition } from '../../schemas/portfolio.js'
import { SERVICE_CONNECTED } from '../../schemas/upstream.js'
import type { StoredImage } from './images.js'

export interface Portfolio extends CreatePortfolioFields {
  readonly id: string
  /** The x-user-id that created it: only that user may update it (DECISIONS 1). */
  readonly owner: string
  readonly image?: StoredImage
  readonly status: 'DRAFT'
  readonly positions: readonly TargetPosition[]
  readonly target_positions: readonly TargetPosition[]
}

export interface StoreState {
  readonly database: string
  readonly cache: string
}

export class PortfolioStore {
  readonly #portfolios = new Map<string, Portfolio>()
  /** owner + Idempotency-Key -> portfolio id (DECISIONS 16): one key never creates two portfolios. */
  readonly #byKey = new Map<string, string>()

  /** What GET /health reports. Always connected: the data lives in this process. */
  state (): StoreState {
    return { database: SERVICE_CONNECTED, cache: SERVICE_CONNECTED }
  }

  get size (): number {
    return this.#portfolios.size
  }

  get (id: string): Portfolio | undefined {
    return this.#portfolios.get(id)
  }

  /** The portfolio, but only for its owner: a foreign id looks exactly like an unknown one. */
  getOwned (id: string, owner: string): Portfolio | undefined {
    const portfolio = this.#portfolios.get(id)
    return portfolio?.owner === owner ? portfolio : undefined
  }

  insert (portfolio: Portfolio): void {
    if (this.#portfolios.has(portfolio.id)) throw new Error(`portfolio ${portfolio.id} already exists`)
    this.#portfolios.set(portfolio.id, freeze(portfolio))
  }

  /** The portfolio this owner already created with this key, if any. */
  createdWithKey (owner: string, key: string): string | undefined {
    return this.#byKey.get(ownerKey(owner, key))
  }

  /**
   * Insert unless the owner already created one with `key`: check and insert
   * in one synchronous step, so concurrent creates with one key make one
   * portfolio. Returns the id that stands for the key.
   */
  insertOnce (portfolio: Portfolio, key: string): string {
    const prior = this.createdWithKey(portfolio.owner, key)
    if (prior !== undefined) return prior
    this.insert(portfolio)
    this.#byKey.set(ownerKey(portfolio.owner, key), portfolio.id)
    return portfolio.id
  }

  /** DECISIONS 2: an update replaces the whole set; a merge could break the sum-to-1 rule. */
  replaceTargets (id: string, owner: string, targets: readonly TargetPosition[]): boolean {
    const portfolio = this.getOwned(id, owner)
    if (portfolio === undefined) return false
    this.#portfolios.set(id, freeze({ ...portfolio, target_positions: targets.map((t) => ({ mint: t.mint, allocation: t.allocation })) }))
    return true
  }
}

const ownerKey = (owner: string, key: string): string => `${owner.length}:${owner}:${key}`

/** Records are frozen so a caller holding one cannot change the store behind its back. */
function freeze (portfolio: Portfolio): Portfolio {
  for (const t of portfolio.target_positions) Object.freeze(t)
  Object.freeze(portfolio.target_positions)
  Object.freeze(portfolio.positions)
  if (portfolio.image !== undefined) Object.freeze(portfolio.image)
  return Object.freeze(portfolio)
}
