/**
 * The engine's store of portfolios and of creates by (owner, Idempotency-Key), in memory or in Redis. It stands in
 * for a real engine's database, so it reports its state for GET /health.
 */
import type { CreatePortfolioFields, TargetPosition } from '../../schemas/portfolio.js'
import type { StoredImage } from './images.js'

export interface Portfolio extends CreatePortfolioFields {
  readonly id: string
  /** The x-user-id that created it: only that user may update it. */
  readonly owner: string
  readonly image?: StoredImage
  readonly status: 'DRAFT'
  readonly positions: readonly TargetPosition[]
  readonly target_positions: readonly TargetPosition[]
}

/** GET /health's `services`: SERVICE_CONNECTED or SERVICE_DISCONNECTED. */
export interface StoreState {
  readonly database: string
  readonly cache: string
}

export const SERVICE_DISCONNECTED = 'disconnected'

/** What a create's Idempotency-Key leaves behind (decision: idempotency). */
export interface KeyRecord {
  readonly portfolioId: string
  /** Undefined for a record an older engine wrote: taken as the same form. */
  readonly fingerprint: string | undefined
}

/** 48 h, longer than the gateway's default IDEMPOTENCY_TTL_S, so the engine remembers a key at least as long. */
export const DEFAULT_KEY_TTL_S = 172_800

export interface PortfolioStore {
  /** Asked now (a Redis PING), never remembered. */
  state: () => Promise<StoreState>
  /** The portfolio, but only for its owner: a foreign id looks exactly like an unknown one. */
  getOwned: (id: string, owner: string) => Promise<Portfolio | undefined>
  createdWithKey: (owner: string, key: string) => Promise<KeyRecord | undefined>
  insert: (portfolio: Portfolio) => Promise<void>
  /**
   * Insert unless the owner already created one with `key`, atomically, so concurrent creates with one key on any
   * engines make one portfolio. Returns the record that stands for the key, this portfolio's or the earlier one's.
   */
  insertOnce: (portfolio: Portfolio, key: string, fingerprint: string) => Promise<KeyRecord>
  /** Replaces the whole set (decision: update replaces); false when `owner` has no portfolio `id`. */
  replaceTargets: (id: string, owner: string, targets: readonly TargetPosition[]) => Promise<boolean>
  close: () => Promise<void>
}

/** Frozen, so a caller holding a record cannot change the store behind its back. */
export function freezePortfolio (portfolio: Portfolio): Portfolio {
  for (const t of portfolio.target_positions) Object.freeze(t)
  Object.freeze(portfolio.target_positions)
  Object.freeze(portfolio.positions)
  if (portfolio.image !== undefined) Object.freeze(portfolio.image)
  return Object.freeze(portfolio)
}

/** Only the two fields of each position, whatever else the parsed body held. */
export function copyTargets (targets: readonly TargetPosition[]): TargetPosition[] {
  return targets.map((t) => ({ mint: t.mint, allocation: t.allocation }))
}
