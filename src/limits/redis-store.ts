/**
 * The shared store: Redis through ioredis (DECISIONS 17). A Redis outage must
 * cost milliseconds, not seconds: short connect and command timeouts, no
 * offline queue (a command while disconnected fails at once), one retry, and
 * reconnection forever in the background with a capped backoff. The gateway
 * starts while Redis is down.
 */
import { Redis } from 'ioredis'
import type { FastifyBaseLogger } from 'fastify'
import type { IdempotencyRecord, LimitStore, WindowHit } from './store.js'

/** INCR and start the window on the first hit, atomically; returns [count, ms left]. */
const HIT_SCRIPT = `
local count = redis.call('INCR', KEYS[1])
if count == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) ttl = tonumber(ARGV[1]) end
return { count, ttl }`

const PREFIX = 'pgw:'

export interface RedisStoreOptions {
  url: string
  log: FastifyBaseLogger
  /** Per-command bound; default 300 ms. */
  commandTimeoutMs?: number
}

export class RedisStore implements LimitStore {
  readonly #redis: Redis
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
    })
    this.#redis.defineCommand('pgwHit', { numberOfKeys: 1, lua: HIT_SCRIPT })
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

  async hit (key: string, windowMs: number): Promise<WindowHit> {
    const [count, ttl] = await (this.#redis as unknown as PgwCommands).pgwHit(PREFIX + 'rl:' + key, windowMs)
    return { count, resetMs: ttl }
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

interface PgwCommands { pgwHit: (key: string, windowMs: number) => Promise<[number, number]> }
