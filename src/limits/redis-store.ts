/**
 * The shared store: Redis through ioredis (DECISIONS 17, 26), one server, a
 * Sentinel-watched primary or a Redis Cluster (redis/client.ts: short
 * timeouts, no offline queue, reconnection forever, a hung server detected).
 * The gateway starts while Redis is down.
 *
 * Three clients: counters and upload leases go through one, idempotency
 * records through another, and replication acknowledgements (`WAIT`, which
 * blocks its connection on the server: redis/replication.ts) through a third,
 * so a slow replica never delays a claim, a completion or a count.
 */
import DataLoader from 'dataloader'
import type { FastifyBaseLogger } from 'fastify'
import type { Redis } from 'ioredis'
import {
  currentWindow,
  pendingOf,
  type IdempotencyRecord,
  type LimitStore,
  type StoreStatus,
  type UploadLeaseStore,
  type WindowHit
} from './store.js'
import { createRedisClient, type RedisClient } from './redis/client.js'
import type { RedisConfig } from '../redis-config.js'
import { groupBySlot, recordKey, uploadsKey, windowKey } from './redis/keys.js'
import { PAUSE_MS, ReplicaWatch, type Acknowledgement } from './redis/replication.js'
import { CLAIM, COMPLETE, COUNT_HITS, ENTER_UPLOAD, RELEASE, RENEW_UPLOADS } from './redis/scripts.js'
import { RedisHealth, type RedisMetrics } from './redis/health.js'

/** A window's key outlives it a little, so instances whose clocks differ by that much still share it. */
const EXPIRY_SLACK_MS = 5_000

/** Hits counted together in one turn, at most. */
const MAX_BATCH = 512

/** Claims whose answer was lost (timeout, dead socket) and may have been stored: released on reconnect, at most this
 * many.
 */
const MAX_ORPHANS = 10_000

interface Scripts {
  countHits: (keyCount: number, ...args: Array<string | number>) => Promise<number[]>
  claimRecord: (keyCount: number, key: string, pending: string, ttlMs: number) => Promise<string | null>
  completeRecord: (keyCount: number, key: string, pending: string, record: string, ttlMs: number) => Promise<number>
  releaseRecord: (keyCount: number, key: string, pending: string) => Promise<number>
  enterUpload: (
    keyCount: number,
    key: string,
    lease: string,
    max: number,
    leaseMs: number,
    ...ended: string[]
  ) => Promise<number>
  renewUploads: (keyCount: number, key: string, leaseMs: number, ...leases: string[]) => Promise<string[]>
}
type ScriptedClient = RedisClient & Scripts

export interface RedisStoreOptions {
  /** The Redis to use; a bare URL is REDIS_URL. */
  redis: RedisConfig | string
  log: FastifyBaseLogger
  metrics?: RedisMetrics
  /** Per-command bound; default 300 ms. */
  commandTimeoutMs?: number
  /** No answer this long while commands wait: the connection is dead; default 1 s. */
  socketTimeoutMs?: number
}

export class RedisStore implements LimitStore {
  readonly #counters: ScriptedClient
  readonly #records: ScriptedClient
  /** Replication acknowledgements only: WAIT blocks this connection, and no other. */
  readonly #acks: RedisClient
  readonly #config: RedisConfig
  readonly #cluster: boolean
  readonly #hits: DataLoader<{ key: string; windowMs: number }, number>
  readonly #replicas: ReplicaWatch
  readonly #health: RedisHealth
  readonly #log: FastifyBaseLogger
  readonly #orphans: Array<{ key: string; pending: string }> = []
  /** A hang check is pending (#dropIfHung). */
  #hungCheck = false
  /** The last records went out from a master without replicas: logged once per change. */
  #alone = false
  /** A missed round was logged in this turn (#missedRound). */
  #missLogged = false

  constructor (opts: RedisStoreOptions) {
    const config: RedisConfig = typeof opts.redis === 'string' ? { mode: 'single', url: opts.redis } : opts.redis
    const clientOpts = {
      ...(opts.commandTimeoutMs === undefined ? {} : { commandTimeoutMs: opts.commandTimeoutMs }),
      ...(opts.socketTimeoutMs === undefined ? {} : { socketTimeoutMs: opts.socketTimeoutMs })
    }
    this.#log = opts.log
    this.#counters = scripted(createRedisClient(config, { ...clientOpts, connectionName: 'gateway-counters' }))
    this.#records = scripted(createRedisClient(config, { ...clientOpts, connectionName: 'gateway-records' }))
    this.#acks = createRedisClient(config, { ...clientOpts, connectionName: 'gateway-acks' })
    this.#config = config
    this.#cluster = config.mode === 'cluster'
    this.#replicas = new ReplicaWatch(this.#acks)
    // The acknowledgements' connection is not the store's health: without it records still go out, unacknowledged.
    this.#health = new RedisHealth([this.#counters, this.#records], opts.log, opts.metrics)
    this.#acks.on('error', () => {})
    this.#acks.on('ready', () => this.#replicas.start())
    this.#records.on('ready', () => {
      void this.#releaseOrphans()
    })
    // Every hit of one turn of the event loop (all the requests whose tokens
    // were verified in it) goes to Redis as one script call per slot: one
    // command's overhead for the batch instead of one per request, and the
    // same user's hits summed into one INCRBY. DataLoader without its cache keeps every hit.
    this.#hits = new DataLoader((hits) => this.#countHits(hits), {
      cache: false,
      maxBatchSize: MAX_BATCH,
      batchScheduleFn: (run) => setImmediate(run)
    })
  }

  /** The counters' client: tests and operators' tools may read it. */
  get client (): RedisClient {
    return this.#counters
  }

  /**
   * Count one hit on the key of the current window (windows aligned to the
   * clock, store.ts), batched with the other hits of this turn. A key that
   * misses its expiry (the instance died in between) is never counted again,
   * since the next window has another key.
   */
  async hit (subject: string, windowMs: number): Promise<WindowHit> {
    const { id, resetMs } = currentWindow(windowMs)
    const count = await this.#hits.load({ key: windowKey(subject, id), windowMs })
    return { count, resetMs }
  }

  /**
   * One batch: the hits of each key summed, and each hit given its own place
   * in the key's count. One script call for a single server; in a cluster
   * one per slot (a script's keys must share a slot), each to its node.
   */
  async #countHits (hits: ReadonlyArray<{ key: string; windowMs: number }>): Promise<Array<number | Error>> {
    const perKey = new Map<string, number>()
    for (const { key } of hits) perKey.set(key, (perKey.get(key) ?? 0) + 1)
    // Windows of one length per store in practice; the longest one's expiry serves them all.
    const expiryMs = Math.max(...hits.map((h) => h.windowMs)) + EXPIRY_SLACK_MS
    const groups = this.#cluster ? [...groupBySlot([...perKey.keys()]).values()] : [[...perKey.keys()]]
    const totals = new Map<string, number | Error>()
    await Promise.all(
      groups.map(async (keys) => {
        try {
          const counts = await this.#counters.countHits(
            keys.length,
            ...keys,
            expiryMs,
            ...keys.map((k) => perKey.get(k)!)
          )
          keys.forEach((key, i) => totals.set(key, counts[i]!))
        } catch (err) {
          this.#dropIfHung(err)
          for (const key of keys) totals.set(key, err as Error)
        }
      })
    )
    // The hits of a key get its last counts in arrival order: the first of n gets total - n + 1.
    const next = new Map<string, number | Error>()
    for (const [key, total] of totals) next.set(key, typeof total === 'number' ? total - perKey.get(key)! + 1 : total)
    return hits.map(({ key }) => {
      const count = next.get(key)!
      if (typeof count === 'number') next.set(key, count + 1)
      return count
    })
  }

  async claim (
    subject: string,
    key: string,
    owner: string,
    pendingTtlMs: number
  ): Promise<IdempotencyRecord | undefined> {
    const k = recordKey(subject, key)
    const pending = pendingRecord(owner)
    let held
    try {
      held = await this.#records.claimRecord(1, k, pending, pendingTtlMs)
    } catch (err) {
      this.#dropIfHung(err)
      // Sent, maybe stored, answer lost: the claim would block the key (409)
      // until it expires. Released (if still ours) once Redis answers again.
      if (mayHaveRun(err)) this.#rememberOrphan(k, pending)
      throw err
    }
    if (held === null) return undefined
    const record = JSON.parse(held) as IdempotencyRecord
    return record.state === 'pending' ? pendingOf(record.owner) : record
  }

  async complete (
    subject: string,
    key: string,
    owner: string,
    record: IdempotencyRecord,
    ttlMs: number
  ): Promise<boolean> {
    const k = recordKey(subject, key)
    let written
    try {
      written = (await this.#records.completeRecord(1, k, pendingRecord(owner), JSON.stringify(record), ttlMs)) === 1
    } catch (err) {
      this.#dropIfHung(err)
      throw err
    }
    if (written) this.#acknowledged(await this.#replicas.acknowledge(subject))
    return written
  }

  async release (subject: string, key: string, owner: string): Promise<boolean> {
    try {
      return (await this.#records.releaseRecord(1, recordKey(subject, key), pendingRecord(owner))) === 1
    } catch (err) {
      this.#dropIfHung(err)
      throw err
    }
  }

  /**
   * Counted and logged: a missed round once (it pauses acknowledgements for
   * a few seconds, replication.ts), each record it covered counted; records
   * that went out unacknowledged meanwhile, or from a master left alone,
   * counted as unreplicated, logged once per change.
   */
  #acknowledged (ack: Acknowledgement): void {
    if (ack === 'acked' || ack === 'no_replicas') {
      this.#alone = false
      return
    }
    this.#health.replicationMissed(ack === 'missed' ? 'missed' : 'unreplicated')
    if (ack === 'missed') {
      if (this.#missedRound()) {
        this.#log.warn(
          { ack, pauseMs: PAUSE_MS },
          'idempotency record not acknowledged by a replica within 100 ms: a failover now could forget it'
        )
      }
    } else if (ack === 'unreplicated' && !this.#alone) {
      this.#alone = true
      this.#log.warn({ ack }, 'idempotency record stored on a master without replicas: a failover now could forget it')
    }
  }

  /** True once per missed round (its records all see 'missed' in the same turn). */
  #missedRound (): boolean {
    if (this.#missLogged) return false
    this.#missLogged = true
    setImmediate(() => {
      this.#missLogged = false
    })
    return true
  }

  /**
   * Upload leases (DECISIONS 23), through the counters' client: one
   * script call to take a place (which also removes the leases given back
   * whose ZREM is still unanswered), a ZREM to give it back, and one renewal
   * call per subject every few seconds while uploads last.
   */
  readonly uploads: UploadLeaseStore = {
    enterUpload: async (subject, lease, max, leaseMs, ended = []) =>
      (await this.#counted(this.#counters.enterUpload(1, uploadsKey(subject), lease, max, leaseMs, ...ended))) === 1,
    leaveUpload: async (subject, lease) => {
      await this.#counted(this.#counters.zrem(uploadsKey(subject), lease))
    },
    renewUploads: async (leases, leaseMs) => {
      const bySubject = new Map<string, string[]>()
      for (const { subject, lease } of leases) bySubject.set(subject, [...(bySubject.get(subject) ?? []), lease])
      const gone = await Promise.all(
        [...bySubject].map(async ([subject, ids]) =>
          (await this.#counted(this.#counters.renewUploads(1, uploadsKey(subject), leaseMs, ...ids))).map((lease) => ({
            subject,
            lease
          }))
        )
      )
      return gone.flat()
    }
  }

  /** A counters' command: a timeout is evidence of a hung server, as for the hits. */
  async #counted<T>(command: Promise<T>): Promise<T> {
    try {
      return await command
    } catch (err) {
      this.#dropIfHung(err)
      throw err
    }
  }

  status (): StoreStatus {
    const config = this.#config
    const nodes =
      config.mode === 'single'
        ? [hostPortOf(config.url)]
        : (config.mode === 'sentinel' ? config.sentinels : config.nodes).map(({ host, port }) => `${host}:${port}`)
    return { mode: config.mode, state: this.#health.state, nodes, replication: this.#replicas.status() }
  }

  async close (): Promise<void> {
    this.#replicas.stop()
    this.#health.stop()
    // quit() would wait for a Redis that may be gone.
    this.#counters.disconnect(false)
    this.#records.disconnect(false)
    this.#acks.disconnect(false)
  }

  /**
   * A command without an answer within commandTimeout: the server is taken
   * for hung at once, and both connections to it dropped. A hung Redis
   * (stopped, or its host partitioned) keeps its TCP connections open, so
   * without this every command would wait out its own timeout, one after the
   * other (a keyed request makes two: its count, then its claim). Destroyed,
   * a connection fails its queued commands, the next ones fail at once (no
   * offline queue), and ioredis reconnects in the background. (socketTimeout
   * does the same after 1 s of silence, in every mode; a cluster's nodes rely
   * on that alone, since one node's silence says nothing of the others.)
   */
  #dropIfHung (err: unknown): void {
    if ((err as Error).message !== 'Command timed out' || this.#cluster || this.#hungCheck) return
    // The evidence is a connection whose *oldest* command has itself timed
    // out, not the error alone: the command that timed out may have belonged
    // to a connection already gone, and the oldest command of a busy, healthy
    // one is often a fresh command still unanswered one turn later. Dropping
    // on that dropped good connections, whose commands then timed out in
    // turn, every 300 ms, after a SIGSTOPped Redis was continued.
    // A timer that fired late (the event loop was busy) is no hang either: the
    // answers may be waiting in the socket. setImmediate runs after the poll
    // phase has read every socket, so a connection whose oldest command is
    // still the same timed-out one then has really received nothing.
    const clients = [this.#counters, this.#records] as Redis[]
    const oldest = clients.map((redis) => redis.commandQueue.peekFront())
    this.#hungCheck = true
    setImmediate(() => {
      this.#hungCheck = false
      const silent = clients.some((redis, i) => {
        const front = redis.commandQueue.peekFront()
        return front !== undefined && front === oldest[i] && timedOut(front.command)
      })
      // Both connections go to the same server: both are dropped.
      if (silent) {
        for (const redis of clients) {
          if (redis.status === 'ready') redis.stream.destroy()
          // Only slow: the connection stays, so no 'ready' will come to release
          // the claims that timed out. Released now, behind them on the same connection.
          else void this.#releaseOrphans()
        }
      }
    })
  }

  #rememberOrphan (key: string, pending: string): void {
    if (this.#orphans.length < MAX_ORPHANS) this.#orphans.push({ key, pending })
  }

  async #releaseOrphans (): Promise<void> {
    const orphans = this.#orphans.splice(0)
    for (const { key, pending } of orphans) {
      try {
        await this.#records.releaseRecord(1, key, pending)
      } catch {
        this.#rememberOrphan(key, pending)
      }
    }
  }
}

/** The pending record of `owner`'s claim: the exact string the compare-and-set scripts compare. */
function pendingRecord (owner: string): string {
  return JSON.stringify({ state: 'pending', owner })
}

/**
 * A queued command that its commandTimeout has rejected: ioredis clears the
 * timer when a command settles, and an answered command leaves the queue, so
 * a command still queued without its timer has waited that long for nothing.
 * (an ioredis internal, listed in docs/architecture.md; were the field ever renamed, every command would
 * count as timed out, which is the check as it was before: still a drop only
 * when the oldest command stays unanswered.)
 */
function timedOut (command: object): boolean {
  return (command as { _commandTimeoutTimer?: unknown })._commandTimeoutTimer === undefined
}

/** A command that failed after it was written: Redis may have run it. */
function mayHaveRun (err: unknown): boolean {
  const message = (err as Error).message
  return !message.includes("Stream isn't writeable") && !message.includes('enableOfflineQueue')
}

/** host:port of a Redis URL: never its user or password. */
function hostPortOf (url: string): string {
  const { hostname, port } = new URL(url)
  return `${hostname}:${port === '' ? '6379' : port}`
}

function scripted (client: RedisClient): ScriptedClient {
  // EVALSHA, and EVAL once when Redis does not know the script yet (ioredis).
  client.defineCommand('countHits', { lua: COUNT_HITS })
  client.defineCommand('claimRecord', { lua: CLAIM })
  client.defineCommand('completeRecord', { lua: COMPLETE })
  client.defineCommand('releaseRecord', { lua: RELEASE })
  client.defineCommand('enterUpload', { lua: ENTER_UPLOAD })
  client.defineCommand('renewUploads', { lua: RENEW_UPLOADS })
  return client as ScriptedClient
}
