/**
 * The shared store: Redis through ioredis (DECISIONS 17). A Redis outage must
 * cost milliseconds, not seconds: short connect and command timeouts, no
 * offline queue (a command while disconnected fails at once), one retry, and
 * reconnection forever in the background with a capped backoff. The gateway
 * starts while Redis is down.
 */
import DataLoader from 'dataloader'
import { Redis } from 'ioredis'
import type { FastifyBaseLogger } from 'fastify'
import { currentWindow, type IdempotencyRecord, type LimitStore, type WindowHit } from './store.js'

/** A window's key outlives it a little, so instances whose clocks differ by that much still share it. */
const EXPIRY_SLACK_MS = 5_000

const PREFIX = 'pgw:'

/** Hits counted together in one script call, at most. */
const MAX_BATCH = 512

/**
 * Count a batch of hits in one call: KEYS are window keys (one per distinct
 * key), ARGV[1] the expiry, ARGV[i + 1] the hits for KEYS[i]. A key's first
 * hits give it its expiry. Redis runs a script whole, so each key's counts
 * are exact, as N separate INCRs would be.
 */
const COUNT_HITS = `
local out = {}
for i, key in ipairs(KEYS) do
  local n = tonumber(ARGV[i + 1])
  local count = redis.call('INCRBY', key, n)
  if count == n then redis.call('PEXPIRE', key, ARGV[1]) end
  out[i] = count
end
return out`

type CountHits = (keyCount: number, ...args: Array<string | number>) => Promise<number[]>

export interface RedisStoreOptions {
  url: string
  log: FastifyBaseLogger
  /** Per-command bound; default 300 ms. */
  commandTimeoutMs?: number
}

export class RedisStore implements LimitStore {
  readonly #redis: Redis & { countHits: CountHits }
  readonly #hits: DataLoader<{ key: string, windowMs: number }, number>
  /** Last state logged: each change is one line, not one per failed reconnect. */
  #state: 'starting' | 'up' | 'down' = 'starting'

  constructor (opts: RedisStoreOptions) {
    const timeout = opts.commandTimeoutMs ?? 300
    this.#redis = new Redis(opts.url, {
      connectTimeout: 500,
      commandTimeout: timeout,
      enableOfflineQueue: false,
      maxRetriesPerRequest: 1,
      // Reconnect forever: 50 ms, 100 ms, ... capped at 1 s.
      retryStrategy: (times) => Math.min(times * 50, 1_000),
      enableReadyCheck: true,
      // Commands issued in one turn of the event loop go out in one write (and
      // their answers come back in one read): under load, far fewer syscalls.
      enableAutoPipelining: true
    }) as Redis & { countHits: CountHits }
    // EVALSHA, and EVAL once when Redis does not know the script yet (ioredis).
    this.#redis.defineCommand('countHits', { lua: COUNT_HITS })
    // Every hit of one turn of the event loop (all the requests whose tokens
    // were verified in it) goes to Redis as one script call: one command's
    // overhead for the batch instead of one per request, and the same user's
    // hits summed into one INCRBY. DataLoader without its cache keeps every hit.
    this.#hits = new DataLoader((hits) => this.#countHits(hits), {
      cache: false,
      maxBatchSize: MAX_BATCH,
      batchScheduleFn: (run) => setImmediate(run)
    })
    this.#redis.on('ready', () => {
      if (this.#state !== 'up') opts.log.info('redis connected')
      this.#state = 'up'
    })
    const down = (reason: string): void => {
      if (this.#state !== 'down') opts.log.warn({ reason }, 'redis unavailable: rate limits fail open, Idempotency-Key requests get 503; reconnecting')
      this.#state = 'down'
    }
    this.#redis.on('error', (err: Error) => down(err.message))
    this.#redis.on('close', () => { if (this.#state === 'up') down('connection closed') })
  }

  /**
   * Count one hit on the key of the current window (windows aligned to the
   * clock, store.ts), batched with the other hits of this turn. A key that
   * misses its expiry (the instance died in between) is never counted again,
   * since the next window has another key.
   */
  async hit (key: string, windowMs: number): Promise<WindowHit> {
    const { id, resetMs } = currentWindow(windowMs)
    const count = await this.#hits.load({ key: `${PREFIX}rl:${key}:${id}`, windowMs })
    return { count, resetMs }
  }

  /** One batch: the hits of each key summed, and each hit given its own place in the key's count. */
  async #countHits (hits: ReadonlyArray<{ key: string, windowMs: number }>): Promise<number[]> {
    const perKey = new Map<string, number>()
    for (const { key } of hits) perKey.set(key, (perKey.get(key) ?? 0) + 1)
    const keys = [...perKey.keys()]
    // Windows of one length per store in practice; the longest one's expiry serves them all.
    const expiryMs = Math.max(...hits.map((h) => h.windowMs)) + EXPIRY_SLACK_MS
    const totals = await this.#redis.countHits(keys.length, ...keys, expiryMs, ...perKey.values())
    // The hits of a key get its last counts in arrival order: the first of n gets total - n + 1.
    const next = new Map(keys.map((key, i) => [key, totals[i]! - perKey.get(key)! + 1]))
    return hits.map(({ key }) => {
      const count = next.get(key)!
      next.set(key, count + 1)
      return count
    })
  }

  async claim (key: string, pendingTtlMs: number): Promise<IdempotencyRecord | undefined> {
    const k = PREFIX + 'idem:' + key
    // SET NX is the claim; a miss reads the holder. The holder can expire in
    // between: then try once more.
    for (let attempt = 0; attempt < 2; attempt++) {
      const set = await this.#redis.set(k, JSON.stringify({ state: 'pending' }), 'PX', pendingTtlMs, 'NX')
      if (set === 'OK') return undefined
      const held = await this.#redis.get(k)
      if (held !== null) return JSON.parse(held) as IdempotencyRecord
    }
    return { state: 'pending' }
  }

  async complete (key: string, record: IdempotencyRecord, ttlMs: number): Promise<void> {
    await this.#redis.set(PREFIX + 'idem:' + key, JSON.stringify(record), 'PX', ttlMs)
  }

  async release (key: string): Promise<void> {
    await this.#redis.del(PREFIX + 'idem:' + key)
  }

  async close (): Promise<void> {
    // quit() would wait for a Redis that may be gone.
    this.#redis.disconnect(false)
  }
}

