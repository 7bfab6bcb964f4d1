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
 *   commands of a dropped connection fail then, not resent after reconnecting
 *   (maxRetriesPerRequest 0: with 1, ioredis fails them only at every second
 *   close, and left them to their commandTimeout 300 ms later, where their
 *   "Command timed out" was taken for a hang of the next connection);
 * - reconnection forever in the background: 50 ms, 100 ms, ... capped at 1 s;
 * - the socketTimeout timer of a closed connection is cleared: ioredis keeps
 *   one timer per client, not per socket, and when it fires it destroys the
 *   socket the client has *then* (ioredis issue 2147, fixed upstream by PR
 *   2148, not in 5.11). A connection dropped with commands in flight thus
 *   killed its healthy successor up to a second later, whose own commands
 *   then timed out, and so on: after a SIGSTOPped Redis was continued, the
 *   gateway fell back to "Redis down" for seconds at a time
 *   (test/limits/redis/hang.test.ts).
 *
 * Sentinel: ioredis asks the Sentinels for the master and checks its role on
 * connect. A dead master's connection fails (closed, or socketTimeout when it
 * hangs) and the reconnect asks the Sentinels again; a master demoted while
 * alive answers writes with READONLY, which reconnects too. ioredis's
 * failoverDetector is off: its subscription, left over from the old
 * connection, could end a reconnect already under way on `+switch-master`,
 * and a client that has ended never reconnects (seen in
 * test/limits/redis/sentinel.test.ts, about 4 runs in 10 on a loaded machine).
 * Cluster: ioredis follows MOVED and ASK, refreshing its slot map. The
 * Cluster client has no offline queue; its per-node connections always have
 * one (ioredis forces `enableOfflineQueue: true` there, and its types refuse
 * the option in redisOptions), but a lost node's connection is not
 * reconnected (its queue fails at once), and commandTimeout bounds a command
 * queued for a node still connecting. The ASKING ioredis sends unwatched
 * before an ASK-redirected command cannot end the process when it fails
 * (catchingAsking), and a command whose caller has been answered is never
 * sent on (neverResendingAbandoned). A node's connection is still made at its
 * first command, so the first redirection to a node can be retried 100 ms
 * later (retryDelayOnFailover): the upload cap does not depend on order (an
 * ENTER carries the gateway's ended leases). Opening every node at once was
 * tried and withdrawn: a test process then sometimes stayed up after its
 * stores were closed. Its
 * autopipelining is off there: a pipeline batched for a node that loses a slot
 * mid-resharding can fail or be retried whole (ioredis issue 2075), and a
 * retried counter script would count twice.
 */
import { Cluster, Redis, type ClusterOptions, type RedisOptions } from 'ioredis'
import type { RedisConfig } from '../../redis-config.js'

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
    // A command whose connection dropped fails at once (ioredis flushes the
    // queue at each close where retryAttempts % (this + 1) is 0: 0 means every
    // close); it is not sent again after the reconnect, where it would run
    // long after its caller gave up (a claim nobody holds, a hit counted twice).
    maxRetriesPerRequest: 0,
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
  const auth =
    config.mode === 'single'
      ? {}
      : {
          ...(config.username === undefined ? {} : { username: config.username }),
          ...(config.password === undefined ? {} : { password: config.password })
        }
  switch (config.mode) {
    case 'single':
      return clearingSocketTimeout(
        new Redis(config.url, {
          ...connection,
          enableOfflineQueue: false,
          retryStrategy: backoff,
          // Commands of one turn of the event loop go out in one write.
          enableAutoPipelining: true,
          ...(tls === undefined ? {} : { tls })
        })
      )
    case 'sentinel':
      return clearingSocketTimeout(
        new Redis({
          ...connection,
          ...auth,
          sentinels: config.sentinels.map(({ host, port }) => ({ host, port })),
          name: config.name,
          role: 'master',
          ...(config.sentinelPassword === undefined ? {} : { sentinelPassword: config.sentinelPassword }),
          sentinelCommandTimeout: CONNECT_TIMEOUT_MS,
          sentinelRetryStrategy: backoff,
          failoverDetector: false,
          // A master demoted to replica while alive: reconnect (and ask the Sentinels), never resend.
          reconnectOnError: (err) => err.message.startsWith('READONLY'),
          enableOfflineQueue: false,
          retryStrategy: backoff,
          enableAutoPipelining: true,
          ...(tls === undefined ? {} : { tls, sentinelTLS: tls, enableTLSForSentinelMode: true })
        })
      )
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
      return neverResendingAbandoned(
        catchingAsking(
          new Cluster(
            config.nodes.map(({ host, port }) => ({ host, port })),
            options
          )
        )
      )
    }
  }
}

/**
 * The ASKING that ioredis 5.11 sends before a command redirected by ASK has
 * nobody waiting on it: the Cluster client calls `redis.asking()` and drops
 * its promise (cluster/index.js, tryConnection). When it fails, its rejection
 * is unhandled and Node ends the process. It fails whenever the ASK target's
 * connection goes before answering it: a slot moving onto a node that holds
 * no slot yet (a cluster being grown) is the usual way. ASK adds that node to
 * the pool and queues ASKING on its connection still being made; the command
 * itself is refused there and retried with a slot refresh; CLUSTER SLOTS does
 * not list a node without slots, so the refresh drops it from the pool and
 * its connection closes ("Connection is closed."). A node that does not answer
 * within commandTimeout fails it too. The redirected command has its own
 * promise, answered or failed as usual; only the ASKING's is caught here.
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
 * A command whose caller has been answered (commandTimeout rejected it, or
 * an error the Cluster client does not retry) is never sent again. ioredis
 * 5.11 keeps handling a cluster command after it rejected it: an ASK or
 * MOVED that arrives late, or its connection closing, still sends it to
 * another node, where it runs long after the gateway moved on (an ENTER that
 * puts back a lease whose ZREM has already run, a hit counted after the
 * request failed open). The same rule as maxRetriesPerRequest 0 above.
 * Swallowed where ioredis decides to redirect or retry, so no ASKING is sent
 * for it either.
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
    // The Cluster client's own redirect handler, installed by send(): reached only while the caller still waits.
    const redirect = command.reject
    command.reject = (err: Error) => {
      if (!abandoned) redirect(err)
    }
    return sent
  }
  return cluster
}

/**
 * Clear the socketTimeout timer when a connection closes (ioredis issue 2147):
 * left running, it would destroy the connection that replaces this one. The
 * next command arms a new timer on the new socket. A cluster's node
 * connections need none of this: a lost node's connection is never
 * reconnected, so its stale timer can only destroy its own dead socket.
 * ('close' is emitted on the next tick after the socket closed; the
 * reconnect waits at least 50 ms, so the timer is gone before a new socket.)
 */
function clearingSocketTimeout (redis: Redis): Redis {
  const internals = redis as unknown as { socketTimeoutTimer?: NodeJS.Timeout }
  redis.on('close', () => {
    clearTimeout(internals.socketTimeoutTimer)
    internals.socketTimeoutTimer = undefined
  })
  return redis
}
