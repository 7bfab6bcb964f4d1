/**
 * The store in Redis (ENGINE_REDIS_URL), so engines behind a
 * balancer agree: a create on one and an update on another find the same
 * portfolio, and one owner's Idempotency-Key creates one portfolio whichever
 * engines receive it.
 *
 * Keys carry the owner in a hash tag, `{owner}`, so one owner's portfolios and
 * keys share a slot and each script's keys are in one slot on a cluster too
 * (DECISIONS 26). The owner is percent-encoded inside the tag: an owner with
 * `{` or `}` could otherwise end the tag early or leave it empty.
 *
 *   pe:portfolio:{owner}:<id>  hash: `record` (JSON, all but the targets), `target_positions` (JSON)
 *   pe:key:{owner}:<key>       string, JSON {"portfolio_id","fingerprint"}: the portfolio
 *                              that key created and its form's fingerprint; it expires
 *                              after the key lifetime (ENGINE_IDEMPOTENCY_TTL_S, DECISIONS 16)
 *
 * Keying a portfolio by owner and id makes a foreign id and an unknown id the
 * same miss (DECISIONS 1) without reading anything. Target positions are a
 * field of their own, so an update is one HSET of JSON made by this process
 * (a Lua cjson round trip would shorten allocations to 14 digits).
 *
 * An outage must cost milliseconds, as the gateway's Redis store does: short
 * connect and command timeouts, no offline queue (a command while
 * disconnected fails at once), and reconnection forever in the background.
 */
import { once } from 'node:events'
import { Redis } from 'ioredis'
import type { FastifyBaseLogger } from 'fastify'
import type { TargetPosition } from '../../schemas/portfolio.js'
import { SERVICE_CONNECTED } from '../../schemas/upstream.js'
import { StoreUnavailableError } from './errors.js'
import {
  copyTargets,
  DEFAULT_KEY_TTL_S,
  freezePortfolio,
  SERVICE_DISCONNECTED,
  type KeyRecord,
  type Portfolio,
  type PortfolioStore,
  type StoreState
} from './store.js'

const PREFIX = 'pe:'

/**
 * A key's record written by an engine before fingerprints is a bare portfolio
 * id (never JSON) with no expiry. Whenever one is read it is given the key
 * lifetime from then on, so it ends like every other record instead of
 * guarding its key forever. Lua, with the key's record in KEYS[1] and the
 * lifetime in ms in the given ARGV slot; leaves the record in `prior`.
 */
const READ_KEY_RECORD = (ttlArg: number): string => `
local prior = redis.call('GET', KEYS[1])
if prior and string.sub(prior, 1, 1) ~= '{' and redis.call('PTTL', KEYS[1]) == -1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[${ttlArg}])
end`

/** KEYS[1] the key's record; ARGV[1] the key lifetime in ms. The record, or nil. */
const GET_KEY = `${READ_KEY_RECORD(1)}
return prior`

/**
 * KEYS[1] the key's record, KEYS[2] the new portfolio; ARGV: key record,
 * portfolio record, targets, key lifetime in ms. The first create with a key
 * wins; the answer is the record that stands for the key.
 */
const INSERT_ONCE = `${READ_KEY_RECORD(4)}
if prior then return prior end
redis.call('HSET', KEYS[2], 'record', ARGV[2], 'target_positions', ARGV[3])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[4])
return ARGV[1]`

/** KEYS[1] the portfolio; ARGV[1] its new targets. 0 when the owner has no such portfolio. */
const REPLACE_TARGETS = `
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'target_positions', ARGV[1])
return 1`

/**
 * Replies that mean "no master to write to right now" (a failover, a replica
 * still loading): unavailable, like a refused connection. Any other reply
 * error is a bug here, and stays a 500.
 */
const UNAVAILABLE_REPLY = /^(READONLY|LOADING|MASTERDOWN|CLUSTERDOWN|TRYAGAIN|NOREPLICAS) /

type Scripts = Redis & {
  getKey: (keys: 1, keyKey: string, keyTtlMs: number) => Promise<string | null>
  insertOnce: (
    keys: 2,
    keyKey: string,
    portfolioKey: string,
    keyRecord: string,
    record: string,
    targets: string,
    keyTtlMs: number
  ) => Promise<string>
  replaceTargets: (keys: 1, portfolioKey: string, targets: string) => Promise<number>
}

export interface RedisPortfolioStoreOptions {
  url: string
  log: FastifyBaseLogger
  /** Per-command bound, health PING included; default 500 ms, under the gateway's 1 s health-check timeout. */
  commandTimeoutMs?: number
  /** How long a key's record lives, in milliseconds (ENGINE_IDEMPOTENCY_TTL_S); default 48 h. */
  keyTtlMs?: number
}

/** All of a stored portfolio but its targets, as written to `record`. */
type PortfolioRecord = Omit<Portfolio, 'target_positions'>

export class RedisPortfolioStore implements PortfolioStore {
  readonly #redis: Scripts
  readonly #keyTtlMs: number
  /** Last state logged: each change is one line, not one per failed reconnect. */
  #state: 'starting' | 'up' | 'down' = 'starting'

  constructor (opts: RedisPortfolioStoreOptions) {
    this.#keyTtlMs = Math.max(1, Math.round(opts.keyTtlMs ?? DEFAULT_KEY_TTL_S * 1000))
    this.#redis = new Redis(opts.url, {
      connectTimeout: 500,
      commandTimeout: opts.commandTimeoutMs ?? 500,
      enableOfflineQueue: false,
      // A command cut off by a dropped connection is sent once more after reconnecting: both scripts may run twice.
      maxRetriesPerRequest: 1,
      // Reconnect forever: 50 ms, 100 ms, ... capped at 1 s.
      retryStrategy: (times) => Math.min(times * 50, 1_000),
      enableReadyCheck: true
    }) as Scripts
    this.#redis.defineCommand('getKey', { lua: GET_KEY })
    this.#redis.defineCommand('insertOnce', { lua: INSERT_ONCE })
    this.#redis.defineCommand('replaceTargets', { lua: REPLACE_TARGETS })
    this.#redis.on('ready', () => {
      if (this.#state !== 'up') opts.log.info('portfolio store connected (redis)')
      this.#state = 'up'
    })
    const down = (reason: string): void => {
      if (this.#state !== 'down') { opts.log.warn({ reason }, 'portfolio store unavailable (redis): creates and updates answer 503; reconnecting') }
      this.#state = 'down'
    }
    this.#redis.on('error', (err: Error) => down(err.message))
    this.#redis.on('close', () => {
      if (this.#state === 'up') down('connection closed')
    })
  }

  async state (): Promise<StoreState> {
    let database = SERVICE_DISCONNECTED
    if (this.#redis.status === 'ready') {
      try {
        if ((await this.#redis.ping()) === 'PONG') database = SERVICE_CONNECTED
      } catch {
        // Timed out or cut off: disconnected, which is what /health reports.
      }
    }
    // The reference engine has no cache apart from its store: it reports the store's state for both.
    return { database, cache: database }
  }

  /** Resolves once the connection is ready (at once when it is): for tools and tests that must not start disconnected.
   *
   */
  async connected (): Promise<void> {
    if (this.#redis.status !== 'ready') await once(this.#redis, 'ready')
  }

  async getOwned (id: string, owner: string): Promise<Portfolio | undefined> {
    const fields = await this.#run(() => this.#redis.hgetall(portfolioKey(owner, id)))
    const { record, target_positions: targets } = fields
    if (record === undefined || targets === undefined) return undefined
    // Written only by this class, from a Portfolio.
    return freezePortfolio({
      ...(JSON.parse(record) as PortfolioRecord),
      target_positions: JSON.parse(targets) as TargetPosition[]
    })
  }

  async createdWithKey (owner: string, key: string): Promise<KeyRecord | undefined> {
    const stored = await this.#run(() => this.#redis.getKey(1, keyKey(owner, key), this.#keyTtlMs))
    return stored === null ? undefined : parseKeyRecord(stored)
  }

  async insert (portfolio: Portfolio): Promise<void> {
    const { record, targets } = serialize(portfolio)
    await this.#run(() =>
      this.#redis.hset(portfolioKey(portfolio.owner, portfolio.id), 'record', record, 'target_positions', targets)
    )
  }

  async insertOnce (portfolio: Portfolio, key: string, fingerprint: string): Promise<KeyRecord> {
    const { record, targets } = serialize(portfolio)
    const keyRecord = JSON.stringify({ portfolio_id: portfolio.id, fingerprint })
    return parseKeyRecord(
      await this.#run(() =>
        this.#redis.insertOnce(
          2,
          keyKey(portfolio.owner, key),
          portfolioKey(portfolio.owner, portfolio.id),
          keyRecord,
          record,
          targets,
          this.#keyTtlMs
        )
      )
    )
  }

  async replaceTargets (id: string, owner: string, targets: readonly TargetPosition[]): Promise<boolean> {
    return (
      (await this.#run(() =>
        this.#redis.replaceTargets(1, portfolioKey(owner, id), JSON.stringify(copyTargets(targets)))
      )) === 1
    )
  }

  async close (): Promise<void> {
    // quit() would wait for a Redis that may be gone.
    this.#redis.disconnect()
  }

  /** One command: an outage (refused, timed out, no master) becomes StoreUnavailableError, answered 503. */
  async #run<T>(command: () => Promise<T>): Promise<T> {
    // Not connected: refused here, so the caller knows nothing was written (no offline queue either).
    if (this.#redis.status !== 'ready') { throw new StoreUnavailableError(`portfolio store unavailable: redis ${this.#redis.status}`, false) }
    try {
      return await command()
    } catch (err) {
      const e = err as Error
      if (e.name === 'ReplyError' && !UNAVAILABLE_REPLY.test(e.message)) throw err
      // A reply error was an answer: the command did not run. Anything else (a timeout, a lost connection) may have.
      throw new StoreUnavailableError(`portfolio store unavailable: ${e.message}`, e.name !== 'ReplyError', {
        cause: err
      })
    }
  }
}

const tag = (owner: string): string => `{${encodeURIComponent(owner)}}`
const portfolioKey = (owner: string, id: string): string => `${PREFIX}portfolio:${tag(owner)}:${id}`
const keyKey = (owner: string, key: string): string => `${PREFIX}key:${tag(owner)}:${key}`

function serialize (portfolio: Portfolio): { record: string; targets: string } {
  const { target_positions: targets, ...record } = portfolio
  return { record: JSON.stringify(record), targets: JSON.stringify(copyTargets(targets)) }
}

/**
 * A key's record as stored. An engine before fingerprints stored the bare
 * portfolio id (a UUID, never JSON), with no expiry: still honoured, as the same
 * form, until the key lifetime has passed since it was first read here (GET_KEY, INSERT_ONCE).
 */
function parseKeyRecord (stored: string): KeyRecord {
  if (!stored.startsWith('{')) return { portfolioId: stored, fingerprint: undefined }
  // Written only by this class.
  const parsed = JSON.parse(stored) as { portfolio_id: string; fingerprint: string }
  return { portfolioId: parsed.portfolio_id, fingerprint: parsed.fingerprint }
}
