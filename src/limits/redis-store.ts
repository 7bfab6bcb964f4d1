/**
 * The shared store: Redis through ioredis (DECISIONS 17). A Redis outage must
 * cost milliseconds, not seconds: short connect and command timeouts, no
 * offline queue (a command while disconnected fails at once), one retry, and
 * reconnection forever in the background with a capped backoff. The gateway
 * starts while Redis is down.
 */
import { Redis } from 'ioredis'
import type { FastifyBaseLogger } from 'fastify'
import { currentWindow, type IdempotencyRecord, type LimitStore, type WindowHit } from './store.js'

/** A window's key outlives it a little, so instances whose clocks differ by that much still share it. */
const EXPIRY_SLACK_MS = 5_000

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
   * One INCR per request on the key of the current window (windows aligned to
   * the clock, store.ts): the cheapest command Redis has, no script to run on
   * the Redis side. The first hit of a window gives the key its expiry; a key
   * that misses it (the instance died in between) is never counted again,
   * since the next window has another key.
   */
  async hit (key: string, windowMs: number): Promise<WindowHit> {
    const { id, resetMs } = currentWindow(windowMs)
    const k = `${PREFIX}rl:${key}:${id}`
    const count = await this.#redis.incr(k)
    if (count === 1) this.#redis.pexpire(k, windowMs + EXPIRY_SLACK_MS).catch(() => {})
    return { count, resetMs }
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

