/**
 * The store in Redis (ENGINE_REDIS_URL), so engines behind a balancer agree on portfolios and on keys.
 *
 *   pe:portfolio:{owner}:<id>  hash: `record` (JSON, all but the targets), `target_positions` (JSON)
 *   pe:key:{owner}:<key>       JSON {"portfolio_id","fingerprint"}, expiring after the key lifetime
 *
 * The owner's hash tag keeps each script's keys in one cluster slot (decision: redis with more than one node); it is
 * percent-encoded, since a `{` or `}` would end the tag early. Keyed by owner, a foreign id is the same miss as an
 * unknown one. Targets are JSON made here, since a Lua cjson round trip would shorten allocations to 14 digits.
 * An outage must cost milliseconds: short timeouts, no offline queue, reconnection forever in the background.
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
 * Reads KEYS[1] into `prior`. A record older engines wrote is a bare id with no expiry: it gets the key lifetime
 * (ARGV[ttlArg], ms) when read, so it does not guard its key forever.
 */
const READ_KEY_RECORD = (ttlArg: number): string => `
local prior = redis.call('GET', KEYS[1])
if prior and string.sub(prior, 1, 1) ~= '{' and redis.call('PTTL', KEYS[1]) == -1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[${ttlArg}])
end`

/** KEYS[1] the key's record; ARGV[1] the key lifetime in ms. The record, or nil. */
const GET_KEY = `${READ_KEY_RECORD(1)}
return prior`

/** KEYS: the key's record, the new portfolio; ARGV: key record, portfolio record, targets, key lifetime in ms. */
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

/** Replies that mean "no master to write to right now": unavailable; any other reply error is a bug, a 500. */
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
  /** Default 500 ms, under the gateway's 1 s health-check timeout. */
  commandTimeoutMs?: number
  keyTtlMs?: number
}

type PortfolioRecord = Omit<Portfolio, 'target_positions'>

export class RedisPortfolioStore implements PortfolioStore {
  readonly #redis: Scripts
  readonly #keyTtlMs: number
  /** Each change is one line, not one per failed reconnect. */
  #state: 'starting' | 'up' | 'down' = 'starting'

  constructor (opts: RedisPortfolioStoreOptions) {
    this.#keyTtlMs = Math.max(1, Math.round(opts.keyTtlMs ?? DEFAULT_KEY_TTL_S * 1000))
    this.#redis = new Redis(opts.url, {
      connectTimeout: 500,
      commandTimeout: opts.commandTimeoutMs ?? 500,
      enableOfflineQueue: false,
      // A command cut off by a dropped connection is sent once more after reconnecting: both scripts may run twice.
      maxRetriesPerRequest: 1,
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
      if (this.#state !== 'down') {
        opts.log.warn({ reason }, 'portfolio store unavailable (redis): creates and updates answer 503; reconnecting')
      }
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
      }
    }
    // The reference engine has no cache apart from its store.
    return { database, cache: database }
  }

  /** Resolves once the connection is ready, for tools and tests that must not start disconnected. */
  async connected (): Promise<void> {
    if (this.#redis.status !== 'ready') await once(this.#redis, 'ready')
  }

  async getOwned (id: string, owner: string): Promise<Portfolio | undefined> {
    const fields = await this.#run(() => this.#redis.hgetall(portfolioKey(owner, id)))
    const { record, target_positions: targets } = fields
    if (record === undefined || targets === undefined) return undefined
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

  /** One command; an outage becomes StoreUnavailableError, answered 503. */
  async #run<T>(command: () => Promise<T>): Promise<T> {
    // Refused here, so the caller knows nothing was written.
    if (this.#redis.status !== 'ready') {
      throw new StoreUnavailableError('portfolio store unavailable: ' +
      `redis ${this.#redis.status}`, false)
    }
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

/** A bare id, as older engines stored it, is honoured as the same form until READ_KEY_RECORD's lifetime ends. */
function parseKeyRecord (stored: string): KeyRecord {
  if (!stored.startsWith('{')) return { portfolioId: stored, fingerprint: undefined }
  const parsed = JSON.parse(stored) as { portfolio_id: string; fingerprint: string }
  return { portfolioId: parsed.portfolio_id, fingerprint: parsed.fingerprint }
}
