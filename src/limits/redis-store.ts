/**
 * The shared store in Redis (decision: shared state). Counters, records and replication acknowledgements each have
 * their own client, so a slow replica's WAIT never delays a claim, a completion or a count.
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

const MAX_BATCH = 512

/** Claims whose answer was lost but may have been stored, released on reconnect, at most this many. */
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
  /** A bare URL is REDIS_URL. */
  redis: RedisConfig | string
  log: FastifyBaseLogger
  metrics?: RedisMetrics
  commandTimeoutMs?: number
  socketTimeoutMs?: number
}

export class RedisStore implements LimitStore {
  readonly #counters: ScriptedClient
  readonly #records: ScriptedClient
  readonly #acks: RedisClient
  readonly #config: RedisConfig
  readonly #cluster: boolean
  readonly #hits: DataLoader<{ key: string; windowMs: number }, number>
  readonly #replicas: ReplicaWatch
  readonly #health: RedisHealth
  readonly #log: FastifyBaseLogger
  readonly #orphans: Array<{ key: string; pending: string }> = []
  #hungCheck = false
  /** The last records went out from a master without replicas. */
  #alone = false
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
    // A turn's hits go as one script call per slot, paying one command's overhead for the batch; no cache, so
    // every hit counts.
    this.#hits = new DataLoader((hits) => this.#countHits(hits), {
      cache: false,
      maxBatchSize: MAX_BATCH,
      batchScheduleFn: (run) => setImmediate(run)
    })
  }

  /** For tests and operators' tools. */
  get client (): RedisClient {
    return this.#counters
  }

  /** A key that misses its expiry is never counted again, since the next window has another key. */
  async hit (subject: string, windowMs: number): Promise<WindowHit> {
    const { id, resetMs } = currentWindow(windowMs)
    const count = await this.#hits.load({ key: windowKey(subject, id), windowMs })
    return { count, resetMs }
  }

  /** Each hit gets its own place in its key's count; in a cluster, one call per slot, as a script's keys must share
   * one.
   */
  async #countHits (hits: ReadonlyArray<{ key: string; windowMs: number }>): Promise<Array<number | Error>> {
    const perKey = new Map<string, number>()
    for (const { key } of hits) perKey.set(key, (perKey.get(key) ?? 0) + 1)
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
    // In arrival order: the first of n hits gets total - n + 1.
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
      // Maybe stored with its answer lost, it would block the key until it expires: released once Redis answers.
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

  /** Every record missed is counted; a missed round is logged once, a master left alone once per change. */
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

  /** A round's records all see 'missed' in the same turn. */
  #missedRound (): boolean {
    if (this.#missLogged) return false
    this.#missLogged = true
    setImmediate(() => {
      this.#missLogged = false
    })
    return true
  }

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
   * A hung Redis keeps its TCP connections open, so without dropping them every command would wait out its own
   * timeout in turn. A cluster relies on socketTimeout alone, since one node's silence says nothing of the others.
   */
  #dropIfHung (err: unknown): void {
    if ((err as Error).message !== 'Command timed out' || this.#cluster || this.#hungCheck) return
    // The evidence is the connection's oldest command timed out, not the error alone (it may be a gone connection's),
    // checked after setImmediate, once the poll phase has read every socket, so a late timer is no hang.
    const clients = [this.#counters, this.#records] as Redis[]
    const oldest = clients.map((redis) => redis.commandQueue.peekFront())
    this.#hungCheck = true
    setImmediate(() => {
      this.#hungCheck = false
      const silent = clients.some((redis, i) => {
        const front = redis.commandQueue.peekFront()
        return front !== undefined && front === oldest[i] && timedOut(front.command)
      })
      if (silent) {
        for (const redis of clients) {
          if (redis.status === 'ready') redis.stream.destroy()
          // No 'ready' will come to release the orphans, so they go now, behind the slow commands.
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

/** The exact string the compare-and-set scripts compare. */
function pendingRecord (owner: string): string {
  return JSON.stringify({ state: 'pending', owner })
}

/**
 * ioredis clears the timer when a command settles, so a queued command without it timed out (an ioredis internal,
 * listed in docs/architecture.md).
 */
function timedOut (command: object): boolean {
  return (command as { _commandTimeoutTimer?: unknown })._commandTimeoutTimer === undefined
}

/** A command that failed after it was written: Redis may have run it. */
function mayHaveRun (err: unknown): boolean {
  const message = (err as Error).message
  return !message.includes("Stream isn't writeable") && !message.includes('enableOfflineQueue')
}

/** Never the URL's user or password. */
function hostPortOf (url: string): string {
  const { hostname, port } = new URL(url)
  return `${hostname}:${port === '' ? '6379' : port}`
}

function scripted (client: RedisClient): ScriptedClient {
  client.defineCommand('countHits', { lua: COUNT_HITS })
  client.defineCommand('claimRecord', { lua: CLAIM })
  client.defineCommand('completeRecord', { lua: COMPLETE })
  client.defineCommand('releaseRecord', { lua: RELEASE })
  client.defineCommand('enterUpload', { lua: ENTER_UPLOAD })
  client.defineCommand('renewUploads', { lua: RENEW_UPLOADS })
  return client as ScriptedClient
}
