/**
 * Who is healthy (decision: several engine endpoints): Envoy's outlier detection (passive, on real calls) and health
 * checker (active, on a connection of its own), kept small, ending in one boolean per endpoint, `up`, which is all the
 * balancer reads. An endpoint that becomes unreachable asks DNS again, since after a rollout the old addresses refuse.
 */
import type { LookupFunction } from 'node:net'
import { Client } from 'undici'
import { isEngineHealth, SERVICE_CONNECTED } from '../../schemas/upstream.js'
import type { Endpoint, EndpointSet } from './endpoints.js'

export const FAILURES_TO_EJECT = 5
export const EJECTION_BASE_MS = 30_000
export const EJECTION_MAX_MS = 300_000
/** The longest the check connection idles: under the idle timeouts servers commonly use (Node's 5 s). */
const CHECK_KEEP_ALIVE_MAX_MS = 4_000
/** A health answer is a few hundred bytes; more is not an engine's. */
const HEALTH_BODY_MAX_BYTES = 64 * 1024

/** A check that failed with one of these never had a connection: the endpoint cannot be reached at all. */
const CONNECT_FAILURES = new Set([
  'ECONNREFUSED',
  'UND_ERR_CONNECT_TIMEOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENOTFOUND',
  'EAI_AGAIN',
  'ETIMEDOUT'
])

export interface HealthEvents {
  /** An endpoint was ejected (gateway_engine_ejections_total). */
  ejected?: (endpoint: Endpoint) => void
  /** An endpoint of the set went out of rotation or came back (`up` is its new state). */
  rotation?: (endpoint: Endpoint) => void
}

export interface HealthOptions {
  /** Active check period, 5 s (decision: several engine endpoints); tests shorten it. 0 turns active checks off. */
  intervalMs?: number
  /** One check's deadline, connection included (1 s). */
  timeoutMs?: number
  /** Base ejection time (30 s); tests shorten it. The longest ejection is ten times it. */
  ejectionBaseMs?: number
  /** How the check connection resolves a name (UPSTREAM_DNS_SERVERS); the system's by default. */
  connectLookup?: LookupFunction
}

/** What one check found. */
type Verdict = 'pass' | 'fail' | 'draining' | 'unreachable'

const codeOf = (err: unknown): string =>
  typeof err === 'object' && err !== null && 'code' in err ? String(err.code) : ''

/** A 200's body passes when every service it reports is connected (decision: several engine endpoints). */
function allConnected (text: string): boolean {
  let body: unknown
  try {
    body = JSON.parse(text)
  } catch {
    return false
  }
  return isEngineHealth.Check(body) && Object.values(body.services).every((state) => state === SERVICE_CONNECTED)
}

/** `GET /health` on `checker`: a 200 whose services are all connected passes, a 500 says the engine drains. */
async function askHealth (checker: Client, e: Endpoint, signal: AbortSignal): Promise<Verdict> {
  const res = await checker.request({
    method: 'GET',
    path: '/health',
    ...(e.hostHeader === undefined ? {} : { headers: { host: e.hostHeader } }),
    signal
  })
  if (res.statusCode !== 200) {
    await res.body.dump({ limit: HEALTH_BODY_MAX_BYTES })
    return res.statusCode === 500 ? 'draining' : 'fail'
  }
  const chunks: Buffer[] = []
  let size = 0
  for await (const chunk of res.body as AsyncIterable<Buffer>) {
    size += chunk.length
    if (size > HEALTH_BODY_MAX_BYTES) return 'fail'
    chunks.push(chunk)
  }
  return allConnected(Buffer.concat(chunks, size).toString('utf8')) ? 'pass' : 'fail'
}

export class HealthState {
  readonly #set: EndpointSet
  readonly #events: HealthEvents
  readonly #intervalMs: number
  readonly #timeoutMs: number
  readonly #connectLookup: LookupFunction | undefined
  readonly #ejectionBaseMs: number
  readonly #ejectionMaxMs: number
  /** Endpoints whose pool events are watched; a new one is also checked at once. */
  readonly #known = new WeakSet<Endpoint>()
  #timer: NodeJS.Timeout | undefined
  /** No endpoint was in rotation at the last look: the transition into it asks DNS again. */
  #noneUp = false
  #started = false
  #closed = false

  constructor (set: EndpointSet, opts: HealthOptions = {}, events: HealthEvents = {}) {
    this.#set = set
    this.#events = events
    this.#intervalMs = opts.intervalMs ?? 5_000
    this.#timeoutMs = opts.timeoutMs ?? 1_000
    this.#connectLookup = opts.connectLookup
    this.#ejectionBaseMs = opts.ejectionBaseMs ?? EJECTION_BASE_MS
    this.#ejectionMaxMs = (EJECTION_MAX_MS * this.#ejectionBaseMs) / EJECTION_BASE_MS
    this.membershipChanged()
    this.#started = true
  }

  /** The set changed: a new endpoint is checked at once, since a new address may drain or refuse. */
  membershipChanged (): void {
    const list = this.#set.list
    for (const e of list) {
      if (this.#known.has(e)) continue
      this.#known.add(e)
      e.pool.on('connectionError', () => {
        this.#unreachable(e)
      })
      e.pool.on('connect', () => {
        e.unreachable = false
      })
      if (this.#started && this.#intervalMs > 0) void this.check(e)
    }
    const wanted = this.#intervalMs > 0 && list.length >= 1
    if (wanted && this.#timer === undefined) {
      this.#timer = setInterval(() => {
        void this.checkAll()
      }, this.#intervalMs).unref()
    }
    if (!wanted && this.#timer !== undefined) {
      clearInterval(this.#timer)
      this.#timer = undefined
    }
    this.#lookAtRotation()
  }

  /** A connection to `e` failed: the first such failure asks DNS again (the address may have gone with a rollout). */
  #unreachable (e: Endpoint): void {
    if (e.unreachable || e.removed) return
    e.unreachable = true
    this.#set.resolveSoon()
  }

  /** With no endpoint left in rotation, DNS is asked again at once (and again at each check round while it lasts). */
  #lookAtRotation (): void {
    const noneUp = this.#set.list.every((e) => !e.up)
    if (noneUp && !this.#noneUp) this.#set.resolveSoon()
    this.#noneUp = noneUp
  }

  /** `e.up` from its state; the multiplier's decay is banked when it leaves rotation. */
  #refresh (e: Endpoint): void {
    const up = !e.ejected && e.checkedHealthy && !e.draining
    if (up === e.up) return
    const now = Date.now()
    if (up) e.upSince = now
    else this.#decay(e, now)
    e.up = up
    if (e.removed) return
    this.#events.rotation?.(e)
    this.#lookAtRotation()
  }

  /** One step down of the ejection multiplier for each base ejection time in rotation since `upSince` (Envoy's). */
  #decay (e: Endpoint, now: number): void {
    if (!e.up || e.ejectionBackoff === 0 || e.upSince === 0) return
    const steps = Math.floor((now - e.upSince) / this.#ejectionBaseMs)
    if (steps === 0) return
    e.ejectionBackoff = Math.max(0, e.ejectionBackoff - steps)
    e.upSince += steps * this.#ejectionBaseMs
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
    const now = Date.now()
    this.#decay(e, now)
    // Envoy's cap: the multiplier stops where the ejection time reaches the maximum.
    if (this.#ejectionBaseMs * (e.ejectionBackoff + 1) <= this.#ejectionMaxMs) e.ejectionBackoff++
    const ms = Math.min(this.#ejectionBaseMs * Math.max(1, e.ejectionBackoff), this.#ejectionMaxMs)
    e.ejections++
    e.ejected = true
    e.consecutiveFailures = 0
    this.#refresh(e)
    e.ejectionTimer = setTimeout(() => {
      this.#unEject(e)
    }, ms).unref()
    e.ejectedUntil = Date.now() + ms
    this.#events.ejected?.(e)
  }

  #unEject (e: Endpoint): void {
    clearTimeout(e.ejectionTimer)
    e.ejectionTimer = undefined
    e.ejected = false
    e.ejectedUntil = 0
    e.consecutiveFailures = 0
    this.#refresh(e)
  }

  /** One round of active checks, every endpoint at once. */
  async checkAll (): Promise<void> {
    await Promise.all(
      this.#set.list.map(async (e) => {
        await this.check(e)
      })
    )
    // DNS may lag behind a rollout: while nothing is in rotation, each round asks again.
    if (!this.#closed && this.#set.list.every((e) => !e.up)) this.#set.resolveSoon()
  }

  async check (e: Endpoint): Promise<void> {
    // A hung engine's checks would pile up, one per interval: one at a time per endpoint.
    if (e.checking || e.removed) return
    e.checking = true
    let verdict: Verdict
    const sentAt = performance.now()
    try {
      verdict = await this.#probe(e)
    } finally {
      e.checking = false
    }
    if (e.removed || this.#closed) return
    if (verdict === 'unreachable') this.#unreachable(e)
    else e.unreachable = false
    if (verdict === 'pass') {
      // An engine that answers its check may serve new work: one held try makes room to find out.
      if (e.held.size !== 0) e.checked(sentAt)
      e.checkFailures = 0
      e.checkSuccesses++
      e.draining = false
      if (e.checkSuccesses >= 2) e.checkedHealthy = true
      // Envoy's default: a passing check ends an ejection, so a restarted engine rejoins within two checks.
      if (e.ejected) this.#unEject(e)
    } else {
      e.checkSuccesses = 0
      e.checkFailures++
      // A draining engine answers 500; it gets no new requests from this check on (decision: the engine drains too).
      if (verdict === 'draining') e.draining = true
      if (e.checkFailures >= 2) e.checkedHealthy = false
    }
    this.#refresh(e)
  }

  /** One check within one deadline, raced: undici settles an abort while connecting only once the connect ends. */
  async #probe (e: Endpoint): Promise<Verdict> {
    const checker = (e.checker ??= this.#checkerFor(e))
    let connected = checker.stats.connected
    const onConnect = (): void => {
      connected = true
    }
    checker.on('connect', onConnect)
    const deadline = new AbortController()
    let timer: NodeJS.Timeout | undefined
    const timedOut = new Promise<'timeout'>((resolve) => {
      timer = setTimeout(() => {
        resolve('timeout')
      }, this.#timeoutMs)
    })
    const asked = askHealth(checker, e, deadline.signal)
    try {
      const first = await Promise.race([asked, timedOut])
      if (first !== 'timeout') return first
      deadline.abort()
      asked.catch(() => {})
      if (e.checker === checker) e.checker = undefined
      checker.destroy().catch(() => {})
      return connected ? 'fail' : 'unreachable'
    } catch (err) {
      return CONNECT_FAILURES.has(codeOf(err)) ? 'unreachable' : 'fail'
    } finally {
      clearTimeout(timer)
      checker.off('connect', onConnect)
    }
  }

  /** The endpoint's own check connection, speaking as the calls it vouches for do (client.ts). */
  #checkerFor (e: Endpoint): Client {
    // Kept for the next check unless the engine says shorter, and never past CHECK_KEEP_ALIVE_MAX_MS: an engine that
    // closes idle sockets after 5 s without saying so would otherwise race the next check, and its reset fail it.
    const keepAlive = Math.min(this.#intervalMs + this.#timeoutMs, CHECK_KEEP_ALIVE_MAX_MS)
    return new Client(e.origin, {
      allowH2: false,
      pipelining: 1,
      connect: {
        timeout: this.#timeoutMs,
        ...(this.#connectLookup === undefined ? {} : { lookup: this.#connectLookup })
      },
      headersTimeout: this.#timeoutMs,
      bodyTimeout: this.#timeoutMs,
      keepAliveTimeout: keepAlive,
      keepAliveMaxTimeout: keepAlive
    })
  }

  close (): void {
    this.#closed = true
    clearInterval(this.#timer)
    this.#timer = undefined
  }
}
