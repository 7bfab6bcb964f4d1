/**
 * The engine's store: portfolios, their owners and target positions, and the
 * create deduplication by (owner, Idempotency-Key). Two implementations, chosen
 * by configuration (issue 19 item 2): memory-store.ts (one process, the
 * default) and redis-store.ts (ENGINE_REDIS_URL: engines that share it agree).
 * It stands in for a real engine's database, so it reports its state for GET /health.
 */
import type { CreatePortfolioFields, TargetPosition } from '../../schemas/portfolio.js'
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

/** GET /health's `services` (DECISIONS 11): `connected` (schemas/upstream.ts SERVICE_CONNECTED) or `disconnected`. */
export interface StoreState {
  readonly database: string
  readonly cache: string
}

export const SERVICE_DISCONNECTED = 'disconnected'

export interface PortfolioStore {
  /** The store's real state, asked now (a Redis PING), never a constant. */
  state: () => Promise<StoreState>
  /** The portfolio, but only for its owner: a foreign id looks exactly like an unknown one. */
  getOwned: (id: string, owner: string) => Promise<Portfolio | undefined>
  /** The portfolio this owner already created with this key, if any. */
  createdWithKey: (owner: string, key: string) => Promise<string | undefined>
  insert: (portfolio: Portfolio) => Promise<void>
  /**
   * Insert unless the owner already created one with `key`, as one atomic
   * step, so concurrent creates with one key (on one engine or several) make
   * one portfolio. Returns the id that stands for the key.
   */
  insertOnce: (portfolio: Portfolio, key: string) => Promise<string>
  /** DECISIONS 2: an update replaces the whole set. False when `owner` has no portfolio `id`. */
  replaceTargets: (id: string, owner: string, targets: readonly TargetPosition[]) => Promise<boolean>
  close: () => Promise<void>
}

/**
 * The store cannot be reached or answered too late: the engine answers 503
 * (errors.ts SERVICE_UNAVAILABLE), since the request may succeed on a retry
 * and, with its Idempotency-Key, will not create a second portfolio.
 */
export class StoreUnavailableError extends Error {
  override name = 'StoreUnavailableError'
  /** False when the command never left this process; true when it may have run (a timeout, a connection lost mid-command). */
  readonly maybeWritten: boolean

  constructor (message: string, maybeWritten: boolean, options?: ErrorOptions) {
    super(message, options)
    this.maybeWritten = maybeWritten
  }
}

/** Records are frozen so a caller holding one cannot change the store behind its back. */
export function freezePortfolio (portfolio: Portfolio): Portfolio {
  for (const t of portfolio.target_positions) Object.freeze(t)
  Object.freeze(portfolio.target_positions)
  Object.freeze(portfolio.positions)
  if (portfolio.image !== undefined) Object.freeze(portfolio.image)
  return Object.freeze(portfolio)
}

/** Only the two fields of each position are kept, whatever else the parsed body held. */
export function copyTargets (targets: readonly TargetPosition[]): TargetPosition[] {
  return targets.map((t) => ({ mint: t.mint, allocation: t.allocation }))
}
