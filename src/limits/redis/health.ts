/** Redis up or down (logged once per change, not per failed reconnect), failovers seen, and replication misses. */
import type { FastifyBaseLogger } from 'fastify'
import type { Cluster, Redis } from 'ioredis'
import type { RedisClient } from './client.js'
import { nodeKey } from './replication.js'

export type ReplicationMiss = 'missed' | 'unreplicated'

export interface RedisMetrics {
  watchRedis: (up: () => boolean) => void
  redisFailedOver: () => void
  redisReplicationMissed: (reason: ReplicationMiss) => void
}

export class RedisHealth {
  readonly #clients: readonly RedisClient[]
  readonly #log: FastifyBaseLogger
  readonly #metrics: RedisMetrics | undefined
  #state: 'starting' | 'up' | 'down' = 'starting'
  #master: string | undefined
  #clusterMasters = new Set<string>()

  constructor (clients: readonly RedisClient[], log: FastifyBaseLogger, metrics?: RedisMetrics) {
    this.#clients = clients
    this.#log = log
    this.#metrics = metrics
    metrics?.watchRedis(() => this.up())
    for (const client of clients) {
      client.on('ready', () => {
        if (this.up() && this.#state !== 'up') log.info('redis connected')
        if (this.up()) this.#state = 'up'
      })
      // Only the message: ioredis's errors name hosts and Redis's replies, never the password.
      client.on('error', (err: Error) => this.#down(err.message))
      client.on('close', () => { if (this.#state === 'up') this.#down('connection closed') })
    }
    const watched = clients[0]
    if (watched === undefined) return
    if (watched.isCluster) {
      const cluster = watched as Cluster
      cluster.on('refresh', () => this.#clusterRefreshed(cluster))
    } else {
      const redis = watched as Redis
      redis.on('ready', () => this.#masterReached(redis))
    }
  }

  get state (): 'starting' | 'up' | 'down' {
    return this.#state
  }

  up (): boolean {
    return this.#clients.every((c) => c.status === 'ready')
  }

  replicationMissed (reason: ReplicationMiss): void {
    this.#metrics?.redisReplicationMissed(reason)
  }

  stop (): void {
    this.#state = 'down'
  }

  #down (reason: string): void {
    if (this.#state !== 'down') {
      this.#log.warn({ reason },
        'redis unavailable: rate limits fail open, Idempotency-Key requests get 503; reconnecting')
    }
    this.#state = 'down'
  }

  /** One server or Sentinel: a master at another address after a reconnect is a failover. */
  #masterReached (redis: Redis): void {
    const stream = redis.stream as { remoteAddress?: string, remotePort?: number } | undefined
    if (stream?.remoteAddress === undefined) return
    const address = `${stream.remoteAddress}:${String(stream.remotePort)}`
    if (this.#master !== undefined && this.#master !== address) {
      this.#log.warn({ from: this.#master, to: address }, 'redis failover: the master is now at another address')
      this.#metrics?.redisFailedOver()
    }
    this.#master = address
  }

  /** A master replaced is a failover; a new master beside the old ones (the cluster grew) is not. */
  #clusterRefreshed (cluster: Cluster): void {
    const masters = new Set(cluster.nodes('master').map(nodeKey))
    const lost = [...this.#clusterMasters].filter((key) => !masters.has(key))
    const gained = [...masters].filter((key) => !this.#clusterMasters.has(key))
    if (this.#clusterMasters.size > 0) {
      for (const node of gained.slice(0, lost.length)) {
        this.#log.warn({ node, replaced: lost }, 'redis failover: another node of the cluster is now a master')
        this.#metrics?.redisFailedOver()
      }
    }
    this.#clusterMasters = masters
  }
}
