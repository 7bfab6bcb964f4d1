/**
 * The gateway's only way to the engine (decision: several engine endpoints): a small cluster client. Answers are
 * collected whole, bounded, because their shape is checked before answering
 * (decision: what the client gets when the engine fails); request bodies stream through unbuffered.
 */
import type { LookupFunction } from 'node:net'
import { Client, Pool } from 'undici'
import { Balancer, type Random } from './balancer.js'
import { connectLookup, EndpointSet, type Endpoint, type Lookup } from './endpoints.js'
import { HealthState, type HealthOptions } from './health.js'
import { RetryBudget } from './retry.js'
import { GatewayError, upstreamError } from '../http/errors.js'
import type { EnginePoolState } from '../observability/metrics.js'
import { abortError, Call, type ClusterContext } from './call.js'
import type {
  ClusterObserver,
  EngineCallObserver,
  EngineClusterStatus,
  EngineRequest,
  EngineResponse,
  EngineTryObserver
} from './types.js'

export type {
  ClusterObserver,
  EngineCallObserver,
  EngineClusterStatus,
  EngineRequest,
  EngineResponse,
  EngineTryInfo,
  EngineTryObserver,
  EngineTrySpan
} from './types.js'

export interface EnginePoolOptions {
  /** One base URL or several (UPSTREAM_URL's list); a name may stand for several addresses. */
  url: string | readonly string[]
  /** One try of a GET when a retry can follow (UPSTREAM_TRY_TIMEOUT_MS); default a third of timeoutMs. */
  tryTimeoutMs?: number
  /** DNS for names in `url` (tests inject one); dns.promises.lookup by default. */
  lookup?: Lookup
  /** Connections to a name ask `lookup` too (UPSTREAM_DNS_SERVERS), which the system resolver may not know. */
  connectWithLookup?: boolean
  /** How often names are resolved again (UPSTREAM_DNS_REFRESH_MS); 0: only when health.ts asks. */
  resolveIntervalMs?: number
  /** Active health checks and ejection times; tests shorten them. */
  health?: HealthOptions
  /** The balancer's and the jitter's randomness (tests fix it). */
  random?: Random
  /** Response headers deadline for calls whose body is small (DECISIONS "Configuration"). */
  timeoutMs: number
  /** Sockets to the engine; requests beyond queue in the pool, not the kernel. */
  connections?: number
  /** Requests in flight per socket (RFC 9112 pipelining); 1 is the safe default. */
  pipelining?: number
  connectTimeoutMs?: number
  /** How long an idle keep-alive socket is kept; below the engine's own idle timeout. */
  keepAliveTimeoutMs?: number
  maxResponseBytes?: number
  /** Requests that may wait for a connection (UPSTREAM_MAX_QUEUE); past it, 503 at once (decision: load shedding). */
  maxQueue?: number
}

/** Who is asking: the request id, the verified subject (never a client header), the trace context
 * (decision: the engine learns the user from the gateway).
 */
export function callerOf (request: {
  id: string
  userId: string
  traceparent: string
}): Pick<EngineRequest, 'requestId' | 'userId' | 'traceparent'> {
  return { requestId: request.id, userId: request.userId, traceparent: request.traceparent }
}

/** The load shedder's overloaded 503 (decision: load shedding), when UPSTREAM_MAX_QUEUE calls already wait. */
function queueFull (): GatewayError {
  return new GatewayError('OVERLOADED', undefined, { headers: { 'retry-after': '1' } })
}

/** What GET /status shows of an endpoint's health: ejected, draining, failing its checks, or up. */
function stateOf (e: Endpoint): EngineClusterStatus['endpoints'][number]['state'] {
  if (e.ejected) return 'ejected'
  if (e.draining) return 'draining'
  return e.up ? 'up' : 'unreachable'
}

/** One observer that tells each of `all` (metrics and the log both hear the cluster). */
function everyOf (all: readonly ClusterObserver[]): ClusterObserver {
  return {
    ejected: (endpoint) => {
      for (const o of all) o.ejected?.(endpoint)
    },
    retried: (call, reason) => {
      for (const o of all) o.retried?.(call, reason)
    },
    budgetExhausted: () => {
      for (const o of all) o.budgetExhausted?.()
    },
    rotation: (endpoint, state) => {
      for (const o of all) o.rotation?.(endpoint, state)
    },
    membership: (endpoints) => {
      for (const o of all) o.membership?.(endpoints)
    },
    lookup: (name, error) => {
      for (const o of all) o.lookup?.(name, error)
    }
  }
}

/** The host name an endpoint came from (the Host it sends), or its address. */
function nameOf (e: Endpoint): string {
  const host = new URL(e.hostHeader === undefined ? e.origin : `http://${e.hostHeader}`).hostname
  return host.startsWith('[') ? host.slice(1, -1) : host
}

/** The own symbol of undici's `queued` field of a Pool. */
export function queuedSymbolOf (pool: Pool): symbol | undefined {
  return Object.getOwnPropertySymbols(pool).find((s) => s.description === 'queued')
}

/** Every limit of an engine connection, set here: undici's defaults are 300 s timeouts. */
function connectionOptions (opts: EnginePoolOptions, viaLookup: LookupFunction | undefined): Client.Options {
  const idleMs = opts.keepAliveTimeoutMs ?? 4_000
  return {
    // HTTP/1.1 only, whatever a TLS engine offers: undici 8 would negotiate HTTP/2 and multiplex every call on
    // one connection, past the per-endpoint connection and queue bounds.
    allowH2: false,
    pipelining: opts.pipelining ?? 1,
    connect: { timeout: opts.connectTimeoutMs ?? 2_000, ...(viaLookup === undefined ? {} : { lookup: viaLookup }) },
    // Capped at the same value, the idle bound is ours whatever the engine's `Keep-Alive: timeout=N` hint says.
    keepAliveTimeout: idleMs,
    keepAliveMaxTimeout: idleMs,
    headersTimeout: opts.timeoutMs,
    bodyTimeout: opts.timeoutMs
  }
}

/** A pool's queued count read from its undici field: `pool.stats` walks every connection, too dear per request. */
function queuedReader (pool: Pool): (pool: Pool) => number {
  const queued = queuedSymbolOf(pool)
  if (queued === undefined) return (p) => p.stats.queued
  return (p) => (p as unknown as Record<symbol, number>)[queued]!
}

export class EngineClient {
  readonly #set: EndpointSet
  readonly #health: HealthState
  /** Shared by every call: made once, so a call allocates nothing for it. */
  readonly #ctx: ClusterContext
  readonly #maxQueue: number
  readonly #queued: (pool: Pool) => number
  #removed: ((endpoint: string) => void) | undefined = undefined
  #clusterObservers: readonly ClusterObserver[] = []
  /** Each name's last lookup that failed (and has not answered since): told to an observer that comes later. */
  readonly #failedLookups = new Map<string, Error>()

  constructor (opts: EnginePoolOptions) {
    this.#maxQueue = opts.maxQueue ?? 256
    const random = opts.random ?? Math.random
    // With UPSTREAM_DNS_SERVERS, connections to a name not yet resolved ask those servers too.
    const viaLookup =
      opts.connectWithLookup === true && opts.lookup !== undefined ? connectLookup(opts.lookup) : undefined
    const connection = connectionOptions(opts, viaLookup)
    // The bounds that exist for one engine hold per endpoint.
    const connections = opts.connections ?? 128
    this.#set = this.#endpointSet(opts, (origin) => new Pool(origin, { ...connection, connections }))
    this.#health = new HealthState(
      this.#set,
      { ...opts.health, ...(viaLookup === undefined ? {} : { connectLookup: viaLookup }) },
      {
        ejected: (e) => this.#ctx.cluster?.ejected?.(e.key),
        rotation: (e) => this.#ctx.cluster?.rotation?.(e.key, stateOf(e))
      }
    )
    this.#ctx = {
      set: this.#set,
      health: this.#health,
      balancer: new Balancer(random),
      budget: new RetryBudget(),
      random,
      timeoutMs: opts.timeoutMs,
      tryTimeoutMs: opts.tryTimeoutMs ?? Math.max(1, Math.floor(opts.timeoutMs / 3)),
      maxResponseBytes: opts.maxResponseBytes ?? 1024 * 1024,
      observer: undefined,
      cluster: undefined,
      tries: undefined,
      // One socket for one try, closed with it: a retry that must not meet another stale pooled socket.
      fresh: (origin) => new Client(origin, connection),
      queued: (pool) => this.#queued(pool)
    }
    this.#queued = queuedReader(this.#set.list[0]!.pool)
  }

  /** The endpoints of `opts.url`, whose changes and lookups are told to the observers. */
  #endpointSet (opts: EnginePoolOptions, pool: (origin: string) => Pool): EndpointSet {
    return new EndpointSet({
      urls: typeof opts.url === 'string' ? [opts.url] : opts.url,
      pool,
      ...(opts.lookup === undefined ? {} : { lookup: opts.lookup }),
      ...(opts.resolveIntervalMs === undefined ? {} : { resolveIntervalMs: opts.resolveIntervalMs }),
      onChange: () => {
        this.#health.membershipChanged()
        this.#ctx.cluster?.membership?.(this.#set.list.map((e) => e.key))
      },
      onRemoved: (e) => {
        this.#removed?.(e.key)
      },
      onLookup: (name, error) => {
        if (error === undefined) this.#failedLookups.delete(name)
        else this.#failedLookups.set(name, error)
        this.#ctx?.cluster?.lookup?.(name, error)
      }
    })
  }

  /** Report every finished call to `observer` (one at a time: the last one set wins). */
  observe (observer: EngineCallObserver): void {
    this.#ctx.observer = observer
  }

  /**
   * Report cluster events to `observer` too, failed lookups so far at once (the first comes before any observer);
   * the returned function stops the reports (an engine client may outlive an app).
   */
  observeCluster (observer: ClusterObserver): () => void {
    this.#setClusterObservers([...this.#clusterObservers, observer])
    for (const [name, error] of this.#failedLookups) observer.lookup?.(name, error)
    return () => {
      this.#setClusterObservers(this.#clusterObservers.filter((o) => o !== observer))
    }
  }

  #setClusterObservers (all: readonly ClusterObserver[]): void {
    this.#clusterObservers = all
    this.#ctx.cluster = all.length <= 1 ? all[0] : everyOf(all)
  }

  /** Tell `observer` of each try as it starts and ends (tracing); at most one: the last one set wins. */
  observeTries (observer: EngineTryObserver): void {
    this.#ctx.tries = observer
  }

  /** Each endpoint's state and load, and the retry budget in use, for GET /status. */
  status (): EngineClusterStatus {
    const budget = this.#ctx.budget
    return {
      endpoints: this.#set.list.map((e) => ({
        endpoint: e.key,
        name: nameOf(e),
        state: stateOf(e),
        ejectedUntil: e.ejected && e.ejectedUntil > 0 ? new Date(e.ejectedUntil).toISOString() : null,
        ejections: e.ejections,
        inFlight: e.inFlight
      })),
      retryBudget: { retriesInFlight: budget.retries, callsInFlight: budget.calls, allowed: budget.allowed() }
    }
  }

  /** Resolved once every name in UPSTREAM_URL has had its first DNS answer. */
  async ready (): Promise<void> {
    await this.#set.ready()
  }

  /** How many endpoints there are now (helpers that scale a bound per endpoint read it). */
  endpointCount (): number {
    return this.#set.list.length
  }

  /** Told of each endpoint that left the set and finished its calls, so its series go; the last one set wins. */
  observeRemovals (observer: (endpoint: string) => void): void {
    this.#removed = observer
  }

  /** Each endpoint (host:port) and whether it is in rotation, for gateway_engine_endpoint_up. */
  endpointStates (): Array<{ endpoint: string; up: boolean }> {
    return this.#set.list.map((e) => ({ endpoint: e.key, up: e.up }))
  }

  /** The connections an endpoint's pool holds open now (tests wait for a killed engine's to be seen closed). */
  connectionsOf (endpoint: string): number | undefined {
    return this.#set.list.find((e) => e.key === endpoint)?.pool.stats.connected
  }

  /** True while any endpoint is out of rotation: /api/health says degraded (decision: several engine endpoints). */
  degraded (): boolean {
    return this.#set.list.some((e) => !e.up)
  }

  /** Run one round of active health checks now (tests; the timer runs them every interval). */
  async checkHealth (): Promise<void> {
    await this.#health.checkAll()
  }

  /** Resolve every name again now (tests; the timer does it every UPSTREAM_DNS_REFRESH_MS). */
  async resolve (): Promise<void> {
    await this.#set.resolve()
  }

  /** Sockets connected, requests waiting for a socket, requests on a socket, summed over the endpoints' pools. */
  poolState (): EnginePoolState {
    let connected = 0
    let queued = 0
    let running = 0
    for (const e of this.#set.list) {
      const s = e.pool.stats
      connected += s.connected
      queued += Math.max(0, s.queued - e.abandonedQueued)
      running += s.running
    }
    return { connected, queued, running }
  }

  /** True when UPSTREAM_MAX_QUEUE calls wait for a connection, over all endpoints. */
  queueFull (): boolean {
    const list = this.#set.list
    let queued = 0
    for (let i = 0; i < list.length; i++) {
      const e = list[i]!
      queued += Math.max(0, this.#queued(e.pool) - e.abandonedQueued)
    }
    return queued >= this.#maxQueue
  }

  /** Send one request and collect the engine's answer. Rejects with a GatewayError only. */
  call (req: EngineRequest): Promise<EngineResponse> {
    // An abort that came first never fires its event again: refuse at once, send nothing.
    if (req.signal?.aborted === true) return Promise.reject(upstreamError(abortError(req.signal.reason)))
    // Past the bound the call would only wait into a timeout: refuse it now.
    if (this.queueFull()) return Promise.reject(queueFull())
    return new Promise<EngineResponse>((resolve, reject) => {
      new Call(this.#ctx, req, resolve, reject).start()
    })
  }

  /** Wait for requests in flight, then close every socket. */
  async close (): Promise<void> {
    this.#health.close()
    await this.#set.close()
  }
}
