/**
 * The gateway's Prometheus metrics (decision: metrics), one registry per app so tests can build many. Every label
 * value comes from a fixed set or the route table, never from the request, so a client cannot grow the series count.
 */
import { collectDefaultMetrics, Counter, Gauge, Registry } from 'prom-client'
import { CounterFamily, HistogramFamily, type CounterSeries, type HistogramSeries } from './series.js'

/** 1 ms to 10 s: a low-latency edge answers in milliseconds, the engine's timeout is seconds. */
export const LATENCY_BUCKETS_S = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]

/** The route label of a request no route matched: never the raw URL. */
export const UNKNOWN_ROUTE = 'unmatched'

export const STATUS_CLASSES = ['1xx', '2xx', '3xx', '4xx', '5xx'] as const

export type EngineCallName = 'ping' | 'create' | 'update' | 'health' | 'other'
/** client_aborted: the gateway gave the call up for the client's sake, nothing the engine did. */
export type EngineOutcome = 'ok' | 'engine_error' | 'unavailable' | 'timeout' | 'bad_response' | 'client_aborted'
export type RejectionReason =
  'auth' | 'validation' | 'rate_limit' | 'shed' | 'body_too_large' | 'upload_cap' | 'upload_busy' | 'upload_slow'
export type IdempotencyOutcome = 'replay' | 'conflict' | 'in_flight' | 'store_unavailable'
/** Why a linger after a refused upload ended (src/http/connection-close.ts LingerEnd). */
export type LingerEndReason =
  'complete' | 'client_closed' | 'server_closed' | 'too_slow' | 'over_bound' | 'total_cap' | 'address_cap' | 'shutdown'
export const LINGER_END_REASONS: readonly LingerEndReason[] =
  ['complete', 'client_closed', 'server_closed', 'too_slow', 'over_bound', 'total_cap', 'address_cap', 'shutdown']

/** Pool counters read at scrape time (undici Pool `stats`). */
export interface EnginePoolState {
  connected: number
  queued: number
  running: number
}

/** Told of every finished call, with the host:port of its last try. */
export type EngineCallObserver = (
  call: EngineCallName,
  outcome: EngineOutcome,
  seconds: number,
  endpoint: string
) => void

/** The cluster's rarer events, for their counters (gateway_engine_*). */
export interface ClusterObserver {
  ejected?: (endpoint: string) => void
  retried?: (call: EngineCallName, reason: string) => void
  budgetExhausted?: () => void
  /** An endpoint went out of rotation or came back; `state` as GET /status shows it. */
  rotation?: (endpoint: string, state: string) => void
  /** The endpoint set changed (DNS): the endpoints it has now. */
  membership?: (endpoints: readonly string[]) => void
  /** A lookup of a name in UPSTREAM_URL ended; `error` when it failed (the name keeps its endpoints). */
  lookup?: (name: string, error: Error | undefined) => void
}

/** What the metrics need of the engine client, which sits in a layer above and satisfies it as it is. */
export interface EngineMetricsSource {
  poolState: () => EnginePoolState
  endpointStates: () => Array<{ endpoint: string; up: boolean }>
  observe: (observer: EngineCallObserver) => void
  observeCluster: (observer: ClusterObserver) => () => void
  observeRemovals: (observer: (endpoint: string) => void) => void
}

export interface MetricsOptions {
  /** Read at each scrape; absent when there is no engine pool to watch. */
  enginePool?: () => EnginePoolState
  /** Each engine endpoint (host:port) and whether it is in rotation, read at each scrape. */
  engineEndpoints?: () => ReadonlyArray<{ endpoint: string; up: boolean }>
  processMetrics?: boolean
}

export class GatewayMetrics {
  readonly registry = new Registry()

  // Plain numbers read at scrape time: see series.ts for why not prom-client's own classes.
  readonly requests = new CounterFamily(
    'gateway_requests_total',
    'Answered requests by route template, method and status class',
    ['route', 'method', 'status_class'],
    this.registry
  )

  readonly requestDuration = new HistogramFamily(
    'gateway_request_duration_seconds',
    'Time from the request arriving to the answer being sent, by route template, method and status class',
    ['route', 'method', 'status_class'],
    LATENCY_BUCKETS_S,
    this.registry
  )

  /** Requests received and not yet answered. */
  inFlight = 0

  /** Connections reading a refused body to throw it away: a plain count, read at scrape time. */
  lingering = 0

  readonly lingeringConnections: Gauge = new Gauge({
    name: 'gateway_lingering_connections',
    help: 'Connections reading the rest of a refused upload to throw it away, so its client can read the answer',
    registers: [this.registry],
    collect: () => { this.lingeringConnections.set(this.lingering) }
  })

  readonly lingersEnded = new Counter({
    name: 'gateway_lingers_ended_total',
    help: 'Lingers after a refused upload, ended by reason: complete (the body read to ' +
      'its end), client_closed (closed, half-closed or reset by the client), ' +
      'server_closed (closed by the gateway otherwise: its idle timeout), too_slow ' +
      '(stalled or under the minimum rate), over_bound (past twice the route limit), ' +
      'total_cap and address_cap (cut to make room), shutdown (cut as the gateway closed)',
    labelNames: ['reason'] as const,
    registers: [this.registry]
  })

  readonly rejections = new Counter({
    name: 'gateway_rejections_total',
    help: 'Requests refused by the gateway itself, by reason (auth, validation, rate_limit, shed, body_too_large)',
    labelNames: ['reason'] as const,
    registers: [this.registry]
  })

  readonly engineCalls = new CounterFamily(
    'gateway_engine_calls_total',
    'Calls to the engine by call, outcome (ok, engine_error, unavailable, timeout, bad_response, client_aborted: ' +
      "given up for the client, not the engine's doing) and the endpoint (host:port) of their last try",
    ['call', 'outcome', 'endpoint'],
    this.registry
  )

  readonly engineCallDuration = new HistogramFamily(
    'gateway_engine_call_duration_seconds',
    'Time from asking the engine (pool queue included) to its full answer or the failure, by call',
    ['call'],
    LATENCY_BUCKETS_S,
    this.registry
  )

  readonly keySetRefreshes = new Counter({
    name: 'gateway_jwks_refreshes_total',
    help: 'Fetches of the JSON Web Key Set by result (ok, failed)',
    labelNames: ['result'] as const,
    registers: [this.registry]
  })

  readonly idempotency = new Counter({
    name: 'gateway_idempotency_total',
    help: 'Idempotency-Key requests not sent to the engine: replay (stored answer), conflict (422 ' +
      'key reused), in_flight (409), store_unavailable (503, the store could not be reached)',
    labelNames: ['outcome'] as const,
    registers: [this.registry]
  })

  readonly keySetUnavailable = new Counter({
    name: 'gateway_jwks_unavailable_total',
    help: 'Tokens answered 503 because their key could not be had: the identity provider was unreachable',
    registers: [this.registry]
  })

  readonly engineEjections = new Counter({
    name: 'gateway_engine_ejections_total',
    help: 'Engine endpoints taken out of rotation by outlier detection ' +
      '(5 consecutive gateway failures), by endpoint (host:port)',
    labelNames: ['endpoint'] as const,
    registers: [this.registry]
  })

  readonly engineRetries = new Counter({
    name: 'gateway_engine_retries_total',
    help: 'Engine calls tried again, by call and reason (unreachable: never ' +
      'reached the engine; reset, try_timeout, bad_response: GETs only)',
    labelNames: ['call', 'reason'] as const,
    registers: [this.registry]
  })

  readonly engineLookupFailures = new Counter({
    name: 'gateway_engine_dns_failures_total',
    help: 'Lookups of a host name in UPSTREAM_URL that failed (its endpoints were kept as they were), by name',
    labelNames: ['name'] as const,
    registers: [this.registry]
  })

  readonly engineRetryBudgetExhausted = new Counter({
    name: 'gateway_engine_retry_budget_exhausted_total',
    help: 'Retries not made because retries in flight had reached 20% of the engine calls in flight (at least 3)',
    registers: [this.registry]
  })

  readonly rateLimitFailOpen = new Counter({
    name: 'gateway_rate_limit_fail_open_total',
    help: 'Requests let through unlimited because the rate-limit store could not be reached',
    registers: [this.registry]
  })

  readonly uploadCapFailOpen = new Counter({
    name: 'gateway_upload_cap_fail_open_total',
    help: 'Creates counted against the per-user upload cap by this ' +
      'gateway alone because the shared store could not be reached',
    registers: [this.registry]
  })

  readonly redisFailovers = new Counter({
    name: 'gateway_redis_failovers_total',
    help: 'Redis role changes seen: the master reached at another ' +
      'address (Sentinel), or a cluster master replaced by another node',
    registers: [this.registry]
  })

  readonly redisReplicationLag = new Counter({
    name: 'gateway_redis_replication_lag_total',
    help: 'Idempotency records no replica acknowledged before the answer went out: missed (WAIT 1 100 timed out), ' +
      'unreplicated (the master had no replica left, or acknowledgements were paused for a few seconds after a miss)',
    labelNames: ['reason'] as const,
    registers: [this.registry]
  })

  readonly traceSpansDropped = new Counter({
    name: 'gateway_trace_spans_dropped_total',
    help: 'Finished spans never exported: the export queue was full, ' +
      'or the collector refused, could not be reached or did not answer in time',
    registers: [this.registry]
  })

  constructor (opts: MetricsOptions = {}) {
    const metrics = this
    new Gauge({
      name: 'gateway_requests_in_flight',
      help: 'Requests received and not yet answered',
      registers: [this.registry],
      collect () {
        this.set(metrics.inFlight)
      }
    })
    const read = opts.enginePool
    if (read !== undefined) {
      new Gauge({
        name: 'gateway_engine_pool_connections',
        help: 'Engine pool state at scrape time: connected sockets, requests queued for a socket, requests running',
        labelNames: ['state'] as const,
        registers: [this.registry],
        collect () {
          const state = read()
          this.set({ state: 'connected' }, state.connected)
          this.set({ state: 'queued' }, state.queued)
          this.set({ state: 'running' }, state.running)
        }
      })
    }
    const endpoints = opts.engineEndpoints
    if (endpoints !== undefined) {
      new Gauge({
        name: 'gateway_engine_endpoint_up',
        help: 'Engine endpoints (host:port) at scrape time: 1 in rotation (health checks pass, not ejected), 0 out',
        labelNames: ['endpoint'] as const,
        registers: [this.registry],
        collect () {
          // The set follows DNS: an endpoint that left stops being reported.
          this.reset()
          for (const { endpoint, up } of endpoints()) this.set({ endpoint }, up ? 1 : 0)
        }
      })
    }
    if (opts.processMetrics !== false) collectDefaultMetrics({ register: this.registry })
    // Series that exist from the start, so rate() and alerts see zeros instead of nothing.
    for (const reason of [
      'auth',
      'validation',
      'rate_limit',
      'shed',
      'body_too_large',
      'upload_cap',
      'upload_busy',
      'upload_slow'
    ] as const) { this.rejections.inc({ reason }, 0) }
    for (const outcome of ['replay', 'conflict', 'in_flight', 'store_unavailable'] as const) {
      this.idempotency.inc({ outcome }, 0)
    }
    for (const result of ['ok', 'failed'] as const) this.keySetRefreshes.inc({ result }, 0)
    for (const reason of ['missed', 'unreplicated'] as const) this.redisReplicationLag.inc({ reason }, 0)
    this.engineRetryBudgetExhausted.inc(0)
    for (const reason of LINGER_END_REASONS) this.lingersEnded.inc({ reason }, 0)
    this.traceSpansDropped.inc(0)
  }

  /** Per endpoint (host:port), per call, per outcome, resolved once. */
  readonly #engineSeries = new Map<
    string,
    Record<EngineCallName, Partial<Record<EngineOutcome, { count: CounterSeries; duration: HistogramSeries }>>>
  >()

  engineCall (call: EngineCallName, outcome: EngineOutcome, seconds: number, endpoint = 'none'): void {
    let byCall = this.#engineSeries.get(endpoint)
    if (byCall === undefined) {
      byCall = { ping: {}, create: {}, update: {}, health: {}, other: {} }
      this.#engineSeries.set(endpoint, byCall)
    }
    const series = (byCall[call][outcome] ??= {
      count: this.engineCalls.series({ call, outcome, endpoint }),
      duration: this.engineCallDuration.series({ call })
    })
    series.count.inc()
    series.duration.observe(seconds)
  }

  /** An endpoint left the set: its series go, so a headless Service's pod turnover does not grow the exposition. */
  engineEndpointGone (endpoint: string): void {
    this.#engineSeries.delete(endpoint)
    this.engineCalls.remove({ endpoint })
    this.engineEjections.remove({ endpoint })
  }

  engineEjected (endpoint: string): void {
    this.engineEjections.inc({ endpoint })
  }

  engineLookupFailed (name: string): void {
    this.engineLookupFailures.inc({ name })
  }

  engineRetried (call: EngineCallName, reason: string): void {
    this.engineRetries.inc({ call, reason })
  }

  /** A retry refused by the retry budget. */
  engineRetryBudgetSpent (): void {
    this.engineRetryBudgetExhausted.inc()
  }

  /** A refused upload's connection began to linger (src/http/connection-close.ts). */
  lingerStarted (): void {
    this.lingering++
  }

  /** A linger ended, and why. */
  lingerEnded (reason: LingerEndReason): void {
    this.lingering--
    this.lingersEnded.inc({ reason })
  }

  rejected (reason: RejectionReason): void {
    this.rejections.inc({ reason })
  }

  keySetRefreshed (ok: boolean): void {
    this.keySetRefreshes.inc({ result: ok ? 'ok' : 'failed' })
  }

  /** A token refused with 503: its key could not be had. */
  keySetKeyUnavailable (): void {
    this.keySetUnavailable.inc()
  }

  idempotencyShortCut (outcome: IdempotencyOutcome): void {
    this.idempotency.inc({ outcome })
  }

  /** The rate-limit store was unreachable and a request went through unlimited. */
  rateLimitFailedOpen (): void {
    this.rateLimitFailOpen.inc()
  }

  /** The upload cap's shared store was unreachable and a create was counted in the process. */
  uploadCapFailedOpen (): void {
    this.uploadCapFailOpen.inc()
  }

  /** Redis is configured: `gateway_redis_up` reads `up` at scrape time. */
  watchRedis (up: () => boolean): void {
    new Gauge({
      name: 'gateway_redis_up',
      help: 'Whether the Redis store is reachable: 1 while every connection is ready, else 0',
      registers: [this.registry],
      collect () {
        this.set(up() ? 1 : 0)
      }
    })
  }

  redisFailedOver (): void {
    this.redisFailovers.inc()
  }

  /** An idempotency record went out without a replica's acknowledgement. */
  redisReplicationMissed (reason: 'missed' | 'unreplicated'): void {
    this.redisReplicationLag.inc({ reason })
  }

  spansDropped (count: number): void {
    this.traceSpansDropped.inc(count)
  }

  async scrape (): Promise<{ contentType: string; body: string }> {
    return { contentType: this.registry.contentType, body: await this.registry.metrics() }
  }
}

// Narrow views, so a test can hand each layer a recorder.
export type LimitsMetrics = Pick<GatewayMetrics, 'rejected' | 'rateLimitFailedOpen' | 'idempotencyShortCut'>
export type RedisStoreMetrics = Pick<GatewayMetrics, 'watchRedis' | 'redisFailedOver' | 'redisReplicationMissed'>
export type KeySetMetrics = Pick<GatewayMetrics, 'keySetRefreshed' | 'keySetKeyUnavailable'>
