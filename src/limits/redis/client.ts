/**
 * The ioredis client for each mode (decisions: shared state; redis with more than one node). A Redis that fails or
 * hangs must cost a request milliseconds, never seconds, and the gateway starts while Redis is down.
 */
import { Cluster, Redis, type ClusterOptions, type RedisOptions } from 'ioredis'
import type { RedisConfig } from '../../redis-config.js'

export type RedisClient = Redis | Cluster

export interface RedisClientOptions {
  /** Default 300 ms. */
  commandTimeoutMs?: number
  /** A partitioned or SIGSTOPped Redis keeps TCP open, so silence while commands wait is death; default 1 s. */
  socketTimeoutMs?: number
  /** Shown by CLIENT LIST. */
  connectionName?: string
}

const CONNECT_TIMEOUT_MS = 500
/**
 * Reconnects wait at least 50 ms: clearingSocketTimeout relies on it, since 'close' comes a tick after the socket
 * closed and must clear the old timer before a new socket exists.
 */
export const backoff = (times: number): number => Math.min(times * 50, 1_000)

/** What every connection to a data node gets, whatever the mode. */
function connectionOptions (opts: RedisClientOptions): RedisOptions {
  return {
    connectTimeout: CONNECT_TIMEOUT_MS,
    commandTimeout: opts.commandTimeoutMs ?? 300,
    socketTimeout: opts.socketTimeoutMs ?? 1_000,
    // Detects a peer whose machine is gone (its kernel does not answer).
    keepAlive: 10_000,
    // 0 fails a dropped connection's commands at every close (1 only at every second one), and none is resent after
    // the reconnect, where it would run long after its caller gave up (a claim nobody holds, a hit counted twice).
    maxRetriesPerRequest: 0,
    autoResendUnfulfilledCommands: false,
    enableReadyCheck: true,
    ...(opts.connectionName === undefined ? {} : { connectionName: opts.connectionName })
  }
}

type Tls = { ca: string } | undefined

/** `Redis` for REDIS_URL and REDIS_SENTINELS, `Cluster` for REDIS_CLUSTER_NODES; it connects in the background. */
export function createRedisClient (config: RedisConfig, opts: RedisClientOptions = {}): RedisClient {
  const connection = connectionOptions(opts)
  const tls = config.tlsCa === undefined ? undefined : { ca: config.tlsCa }
  switch (config.mode) {
    case 'single':
      return clearingSocketTimeout(
        new Redis(config.url, {
          ...connection,
          enableOfflineQueue: false,
          retryStrategy: backoff,
          enableAutoPipelining: true,
          ...(tls === undefined ? {} : { tls })
        })
      )
    case 'sentinel':
      return clearingSocketTimeout(new Redis(sentinelOptions(config, connection, tls)))
    case 'cluster':
      return neverResendingAbandoned(
        catchingAsking(
          new Cluster(
            config.nodes.map(({ host, port }) => ({ host, port })),
            clusterOptions(config, connection, tls)
          )
        )
      )
  }
}

/** Sentinel and Cluster data nodes take their credentials apart (REDIS_URL carries its own). */
function authOf (config: Exclude<RedisConfig, { mode: 'single' }>): RedisOptions {
  return {
    ...(config.username === undefined ? {} : { username: config.username }),
    ...(config.password === undefined ? {} : { password: config.password })
  }
}

function sentinelOptions (
  config: Extract<RedisConfig, { mode: 'sentinel' }>,
  connection: RedisOptions,
  tls: Tls
): RedisOptions {
  return {
    ...connection,
    ...authOf(config),
    sentinels: config.sentinels.map(({ host, port }) => ({ host, port })),
    name: config.name,
    role: 'master',
    ...(config.sentinelPassword === undefined ? {} : { sentinelPassword: config.sentinelPassword }),
    sentinelCommandTimeout: CONNECT_TIMEOUT_MS,
    sentinelRetryStrategy: backoff,
    // Its subscription, left from the old connection, could end a reconnect under way, and an ended client never
    // reconnects; a dead master's connection fails and the reconnect asks the Sentinels anyway.
    failoverDetector: false,
    // A master demoted while alive answers READONLY: reconnect and ask the Sentinels, never resend.
    reconnectOnError: (err) => err.message.startsWith('READONLY'),
    enableOfflineQueue: false,
    retryStrategy: backoff,
    enableAutoPipelining: true,
    ...(tls === undefined ? {} : { tls, sentinelTLS: tls, enableTLSForSentinelMode: true })
  }
}

function clusterOptions (
  config: Extract<RedisConfig, { mode: 'cluster' }>,
  connection: RedisOptions,
  tls: Tls
): ClusterOptions {
  return {
    // ioredis forces an offline queue on each node's own connection whatever is set here; commandTimeout is what
    // bounds a command queued for a node still connecting.
    enableOfflineQueue: false,
    enableReadyCheck: true,
    // A pipeline batched for a node that loses a slot can be retried whole (ioredis issue 2075), counting twice.
    enableAutoPipelining: false,
    scaleReads: 'master',
    // A resharding or failover answers MOVED/ASK/TRYAGAIN/CLUSTERDOWN for a moment: a few quick retries, then fail.
    maxRedirections: 8,
    retryDelayOnMoved: 0,
    retryDelayOnFailover: 100,
    retryDelayOnClusterDown: 100,
    retryDelayOnTryAgain: 50,
    slotsRefreshTimeout: 1_000,
    slotsRefreshInterval: 5_000,
    clusterRetryStrategy: backoff,
    redisOptions: { ...connection, ...authOf(config), ...(tls === undefined ? {} : { tls }) },
    // With TLS, connect to the address the cluster announces (the certificate names it), not a reverse-resolved name.
    ...(tls === undefined ? {} : { dnsLookup: (address, callback) => callback(null, address) })
  }
}

/**
 * ioredis drops the promise of the ASKING it sends before an ASK-redirected command, so its failure (a slot moving
 * onto a node not yet listed by CLUSTER SLOTS, as a cluster grows) would be unhandled and end the process.
 */
function catchingAsking (cluster: Cluster): Cluster {
  cluster.on('+node', (node: Redis) => {
    const asking = node.asking.bind(node) as (...args: unknown[]) => Promise<unknown>
    node.asking = ((...args: unknown[]) => {
      const answer = asking(...args)
      answer.catch(() => {})
      return answer
    }) as Redis['asking']
  })
  return cluster
}

/**
 * ioredis still redirects a cluster command after rejecting it, so it would run long after the gateway moved on (an
 * ENTER that puts back a lease already removed); a command whose caller has been answered is never sent again.
 */
function neverResendingAbandoned (cluster: Cluster): Cluster {
  const send = cluster.sendCommand.bind(cluster)
  cluster.sendCommand = (command, stream, node) => {
    const sent = send(command, stream, node)
    let abandoned = false
    const settle = (): void => {
      abandoned = true
    }
    command.promise.then(settle, settle)
    const redirect = command.reject
    command.reject = (err: Error) => {
      if (!abandoned) redirect(err)
    }
    return sent
  }
  return cluster
}

/**
 * ioredis keeps one socketTimeout timer per client (ioredis issue 2147): left running after a close, it destroys the
 * connection that replaced this one. Clearing it on 'close' is in time only because a reconnect waits (backoff).
 * Cluster nodes are never reconnected, so they need none of this.
 */
function clearingSocketTimeout (redis: Redis): Redis {
  const internals = redis as unknown as { socketTimeoutTimer?: NodeJS.Timeout }
  redis.on('close', () => {
    clearTimeout(internals.socketTimeoutTimer)
    internals.socketTimeoutTimer = undefined
  })
  return redis
}
