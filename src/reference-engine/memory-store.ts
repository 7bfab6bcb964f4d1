/**
 * The store in this process's memory: right for one engine (the embedded one,
 * or `npm run engine` without ENGINE_REDIS_URL). Always connected.
 */
import type { TargetPosition } from '../../schemas/portfolio.js'
import { SERVICE_CONNECTED } from '../../schemas/upstream.js'
import { copyTargets, freezePortfolio, type Portfolio, type PortfolioStore, type StoreState } from './store.js'

const CONNECTED: StoreState = Object.freeze({ database: SERVICE_CONNECTED, cache: SERVICE_CONNECTED })

export class MemoryPortfolioStore implements PortfolioStore {
  readonly #portfolios = new Map<string, Portfolio>()
  /** owner + Idempotency-Key -> portfolio id (DECISIONS 16): one key never creates two portfolios. */
  readonly #byKey = new Map<string, string>()

  /** The data lives in this process, so it is reachable whenever the engine answers. */
  async state (): Promise<StoreState> {
    return CONNECTED
  }

  /** For tests and tools in this process: how many portfolios exist. */
  get size (): number {
    return this.#portfolios.size
  }

  /** For tests and tools in this process: any portfolio by id, synchronously. */
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

  async createdWithKey (owner: string, key: string): Promise<string | undefined> {
    return this.#byKey.get(ownerKey(owner, key))
  }

  /** Check and insert with no await in between: one turn of the event loop, so atomic. */
  async insertOnce (portfolio: Portfolio, key: string): Promise<string> {
    const prior = this.#byKey.get(ownerKey(portfolio.owner, key))
    if (prior !== undefined) return prior
    this.#insert(portfolio)
    this.#byKey.set(ownerKey(portfolio.owner, key), portfolio.id)
    return portfolio.id
  }

  async replaceTargets (id: string, owner: string, targets: readonly TargetPosition[]): Promise<boolean> {
    const portfolio = await this.getOwned(id, owner)
    if (portfolio === undefined) return false
    this.#portfolios.set(id, freezePortfolio({ ...portfolio, target_positions: copyTargets(targets) }))
    return true
  }

  async close (): Promise<void> {}

  #insert (portfolio: Portfolio): void {
    if (this.#portfolios.has(portfolio.id)) throw new Error(`portfolio ${portfolio.id} already exists`)
    this.#portfolios.set(portfolio.id, freezePortfolio(portfolio))
  }
}

const ownerKey = (owner: string, key: string): string => `${owner.length}:${owner}:${key}`
