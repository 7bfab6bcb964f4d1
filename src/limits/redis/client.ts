/**
 * The ioredis client for each mode (DECISIONS 17, 26), with the same rules in
 * every mode: a Redis that fails or hangs must cost a request milliseconds,
 * never seconds, and the gateway starts while Redis is down.
 *
 * - connectTimeout 500 ms; commandTimeout 300 ms: a command without an answer
 *   is rejected (503 for keyed requests, limits open);
 * - socketTimeout 1 s: a connection that has sent commands and received no
 *   byte for that long is dead (a SIGSTOPped or partitioned Redis keeps the
 *   TCP connection open, and TCP keep-alive is answered by its kernel). It is
 *   destroyed, its queued commands fail, and the client reconnects, so
 *   nothing piles up behind a hung server;
 * - no offline queue: while not connected a command fails at once, and the
 *   commands of a dropped connection fail then, not resent after reconnecting;
 * - reconnection forever in the background: 50 ms, 100 ms, ... capped at 1 s.
 *
 * Sentinel: ioredis asks the Sentinels for the master, checks its role on
 * connect, and (failoverDetector) drops the connection on `+switch-master`.
 * Cluster: ioredis follows MOVED and ASK, refreshing its slot map. The
 * Cluster client has no offline queue; its per-node connections always have
 * one (ioredis forces `enableOfflineQueue: true` there, and its types refuse
 * the option in redisOptions), but a lost node's connection is not
 * reconnected (its queue fails at once), and commandTimeout bounds a command
 * queued for a node still connecting. Its
 * autopipelining is off there: a pipeline batched for a node that loses a slot
 * mid-resharding can fail or be retried whole (ioredis issue 2075), and a
 * retried counter script would count twice.
 */
import { Cluster, Redis, type ClusterOptions, type RedisOptions } from 'ioredis'
import type { RedisConfig } from './config.js'

export type RedisClient = Redis | Cluster

export interface RedisClientOptions {
  /** Per-command bound; default 300 ms. */
  commandTimeoutMs?: number
  /** No byte back this long while commands wait: the connection is dead; default 1 s. */
  socketTimeoutMs?: number
  /** A name shown by CLIENT LIST, to tell the gateway's connections apart. */
  connectionName?: string
}

const CONNECT_TIMEOUT_MS = 500
/** Reconnect forever: 50 ms, 100 ms, ... capped at 1 s. */
const backoff = (times: number): number => Math.min(times * 50, 1_000)

/** What every connection to a data node gets, whatever the mode. */
function connectionOptions (opts: RedisClientOptions): RedisOptions {
  return {
    connectTimeout: CONNECT_TIMEOUT_MS,
    commandTimeout: opts.commandTimeoutMs ?? 300,
    socketTimeout: opts.socketTimeoutMs ?? 1_000,
    // Detects a peer whose machine is gone (its kernel does not answer).
    keepAlive: 10_000,
    maxRetriesPerRequest: 1,
    // A command whose connection dropped fails at once; it is not sent again
    // after the reconnect, where it would run long after its caller gave up
    // (a claim nobody holds, a hit counted twice).
    autoResendUnfulfilledCommands: false,
    enableReadyCheck: true,
    ...(opts.connectionName === undefined ? {} : { connectionName: opts.connectionName })
  }
}

/**
 * The client for `config`: `Redis` for REDIS_URL and REDIS_SENTINELS, `Cluster`
 * for REDIS_CLUSTER_NODES. It connects in the background; listen for 'ready'.
 */
export function createRedisClient (config: RedisConfig, opts: RedisClientOptions = {}): RedisClient {
  const connection = connectionOptions(opts)
  const tls = config.tlsCa === undefined ? undefined : { ca: config.tlsCa }
  const auth = config.mode === 'single' ? {} : { ...(config.username === undefined ? {} : { username: config.username }), ...(config.password === undefined ? {} : { password: config.password }) }
  switch (config.mode) {
    case 'single':
      return new Redis(config.url, {
        ...connection,
        enableOfflineQueue: false,
        retryStrategy: backoff,
        // Commands of one turn of the event loop go out in one write.
        enableAutoPipelining: true,
        ...(tls === undefined ? {} : { tls })
      })
    case 'sentinel':
      return new Redis({
        ...connection,
        ...auth,
        sentinels: config.sentinels.map(({ host, port }) => ({ host, port })),
        name: config.name,
        role: 'master',
        ...(config.sentinelPassword === undefined ? {} : { sentinelPassword: config.sentinelPassword }),
        sentinelCommandTimeout: CONNECT_TIMEOUT_MS,
        sentinelRetryStrategy: backoff,
        // Subscribe to +switch-master: leave the old master the moment Sentinel announces the new one.
        failoverDetector: true,
        enableOfflineQueue: false,
        retryStrategy: backoff,
        enableAutoPipelining: true,
        ...(tls === undefined ? {} : { tls, sentinelTLS: tls, enableTLSForSentinelMode: true })
      })
    case 'cluster': {
      const options: ClusterOptions = {
        enableOfflineQueue: false,
        enableReadyCheck: true,
        enableAutoPipelining: false,
        scaleReads: 'master',
        // A resharding or a failover answers MOVED/ASK/TRYAGAIN/CLUSTERDOWN for
        // a moment: a few quick retries, then the command fails (503, limits open).
        maxRedirections: 8,
        retryDelayOnMoved: 0,
        retryDelayOnFailover: 100,
        retryDelayOnClusterDown: 100,
        retryDelayOnTryAgain: 50,
        slotsRefreshTimeout: 1_000,
        slotsRefreshInterval: 5_000,
        clusterRetryStrategy: backoff,
        redisOptions: { ...connection, ...auth, ...(tls === undefined ? {} : { tls }) },
        // With TLS, connect to the address the cluster announces as it is
        // (the certificate names it), not a reverse-resolved name.
        ...(tls === undefined ? {} : { dnsLookup: (address, callback) => callback(null, address) })
      }
      return new Cluster(config.nodes.map(({ host, port }) => ({ host, port })), options)
    }
  }
}
