/**
 * The engine's store: portfolios, their owners and target positions, and the
 * create deduplication by (owner, Idempotency-Key). Two implementations, chosen
 * By configuration: memory-store.ts (one process, the
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

/**
 * What a create's Idempotency-Key leaves behind (DECISIONS 16): the
 * portfolio it made and the fingerprint of its form (shared/fingerprint.ts),
 * so a later create with the same key and another form is told apart.
 */
export interface KeyRecord {
  readonly portfolioId: string
  /** Undefined only for a record written before fingerprints were kept: taken as the same form. */
  readonly fingerprint: string | undefined
}

/**
 * How long a key's record lives by default: 48 h, longer than the gateway's
 * IDEMPOTENCY_TTL_S (24 h by default), so the engine remembers a key at
 * least as long as any gateway in front of it (ENGINE_IDEMPOTENCY_TTL_S).
 */
export const DEFAULT_KEY_TTL_S = 172_800

export interface PortfolioStore {
  /** The store's real state, asked now (a Redis PING), never a constant. */
  state: () => Promise<StoreState>
  /** The portfolio, but only for its owner: a foreign id looks exactly like an unknown one. */
  getOwned: (id: string, owner: string) => Promise<Portfolio | undefined>
  /** The record of the portfolio this owner created with this key, if any that has not expired. */
  createdWithKey: (owner: string, key: string) => Promise<KeyRecord | undefined>
  insert: (portfolio: Portfolio) => Promise<void>
  /**
   * Insert unless the owner already created one with `key`, as one atomic
   * step, so concurrent creates with one key (on one engine or several) make
   * one portfolio. Records the key with the form's fingerprint for the
   * store's key lifetime. Returns the record that stands for the key: this
   * portfolio's, or the earlier one's (whose fingerprint may differ).
   */
  insertOnce: (portfolio: Portfolio, key: string, fingerprint: string) => Promise<KeyRecord>
  /** DECISIONS 2: an update replaces the whole set. False when `owner` has no portfolio `id`. */
  replaceTargets: (id: string, owner: string, targets: readonly TargetPosition[]) => Promise<boolean>
  close: () => Promise<void>
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
