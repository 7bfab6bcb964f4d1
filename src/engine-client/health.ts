/**
 * Who is healthy (DECISIONS 24, Envoy's outlier detection and health checker,
 * kept small). Two sources of truth about one endpoint:
 * - passive: 5 consecutive gateway failures of real calls eject it for
 *   30 s x its ejections so far (at most 300 s); at most half the set is
 *   ejected at once (rounded down, but one may always be when there are two
 *   or more); a single endpoint is never ejected;
 * - active: `GET /health` every 5 s with a 1 s timeout; 2 failures in a row
 *   mark it unhealthy, 2 successes healthy again; a success ends an ejection
 *   early; a 500 (the engine draining, DECISIONS 25) takes it out of rotation
 *   at once.
 * Both end in one boolean per endpoint, `up`, which is all the balancer reads.
 */
import type { Endpoint, EndpointSet } from './endpoints.js'

export const FAILURES_TO_EJECT = 5
export const EJECTION_BASE_MS = 30_000
export const EJECTION_MAX_MS = 300_000

/** A check that failed with one of these never had a connection: the endpoint cannot be reached at all. */
const CONNECT_FAILURES = new Set(['ECONNREFUSED', 'UND_ERR_CONNECT_TIMEOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN', 'ETIMEDOUT'])

export interface HealthEvents {
  /** An endpoint was ejected (gateway_engine_ejections_total). */
  ejected?: (endpoint: Endpoint) => void
}

export interface HealthOptions {
  /** Active check period (DECISIONS 24: 5 s); tests shorten it. 0 turns active checks off. */
  intervalMs?: number
  /** One check's deadline, connection included (1 s). */
  timeoutMs?: number
  /** Base ejection time (30 s); tests shorten it. */
  ejectionBaseMs?: number
}

function refresh (e: Endpoint): void {
  e.up = !e.ejected && e.checkedHealthy && !e.draining
}

export class HealthState {
  readonly #set: EndpointSet
  readonly #events: HealthEvents
  readonly #intervalMs: number
  readonly #timeoutMs: number
  readonly #ejectionBaseMs: number
  #timer: NodeJS.Timeout | undefined

  constructor (set: EndpointSet, opts: HealthOptions = {}, events: HealthEvents = {}) {
    this.#set = set
    this.#events = events
    this.#intervalMs = opts.intervalMs ?? 5_000
    this.#timeoutMs = opts.timeoutMs ?? 1_000
    this.#ejectionBaseMs = opts.ejectionBaseMs ?? EJECTION_BASE_MS
    this.membershipChanged()
  }

  /**
   * Active checks run while there are two endpoints or more: a single one gets
   * every request anyway (panic), so checking it would change nothing but add
   * calls to the engine.
   */
  membershipChanged (): void {
    const wanted = this.#intervalMs > 0 && this.#set.list.length >= 2
    if (wanted && this.#timer === undefined) this.#timer = setInterval(() => { this.checkAll() }, this.#intervalMs).unref()
    if (!wanted && this.#timer !== undefined) {
      clearInterval(this.#timer)
      this.#timer = undefined
    }
  }

  /** A real call answered within the contract (or with the engine's own error): the failure streak ends. */
  succeeded (e: Endpoint): void {
    if (e.consecutiveFailures !== 0) e.consecutiveFailures = 0
  }

  /** A gateway failure of a real call (refused, reset, timeout, outside the contract, a 503). */
  failed (e: Endpoint): void {
    if (++e.consecutiveFailures < FAILURES_TO_EJECT || e.ejected || e.removed) return
    const list = this.#set.list
    if (list.length < 2) return
    let ejected = 0
    for (const other of list) if (other.ejected) ejected++
    if (ejected >= Math.max(1, Math.floor(list.length / 2))) return
    e.ejections++
    e.ejected = true
    e.consecutiveFailures = 0
    refresh(e)
    const ms = Math.min(this.#ejectionBaseMs * e.ejections, EJECTION_MAX_MS * this.#ejectionBaseMs / EJECTION_BASE_MS)
    e.ejectionTimer = setTimeout(() => { this.#unEject(e) }, ms).unref()
    e.ejectedUntil = Date.now() + ms
    this.#events.ejected?.(e)
  }

  #unEject (e: Endpoint): void {
    clearTimeout(e.ejectionTimer)
    e.ejectionTimer = undefined
    e.ejected = false
    e.consecutiveFailures = 0
    refresh(e)
  }

  /** One round of active checks, every endpoint at once. */
  checkAll (): Promise<void[]> {
    return Promise.all(this.#set.list.map(async (e) => { await this.check(e) }))
  }

  async check (e: Endpoint): Promise<void> {
    // A hung engine's checks would pile up, one per interval: one at a time per endpoint.
    if (e.checking) return
    e.checking = true
    let status = 0
    let connectFailed = false
    try {
      const res = await e.pool.request({
        method: 'GET',
        path: '/health',
        ...(e.hostHeader === undefined ? {} : { headers: { host: e.hostHeader } }),
        signal: AbortSignal.timeout(this.#timeoutMs),
        headersTimeout: this.#timeoutMs,
        bodyTimeout: this.#timeoutMs
      })
      status = res.statusCode
      await res.body.dump({ limit: 64 * 1024 })
    } catch (err) {
      status = 0
      const code = typeof err === 'object' && err !== null && 'code' in err ? String(err.code) : ''
      connectFailed = CONNECT_FAILURES.has(code)
    } finally {
      e.checking = false
    }
    if (e.removed) return
    e.unreachable = connectFailed
    if (status === 200) {
      e.checkFailures = 0
      e.checkSuccesses++
      e.draining = false
      if (e.checkSuccesses >= 2) e.checkedHealthy = true
      // Envoy's default: a passing check ends an ejection, so a restarted engine rejoins within two checks.
      if (e.ejected) this.#unEject(e)
    } else {
      e.checkSuccesses = 0
      e.checkFailures++
      // DECISIONS 25: a draining engine answers 500; it gets no new requests from this check on.
      if (status === 500) e.draining = true
      if (e.checkFailures >= 2) e.checkedHealthy = false
    }
    refresh(e)
  }

  close (): void {
    clearInterval(this.#timer)
    this.#timer = undefined
  }
}
