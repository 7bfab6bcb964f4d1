/**
 * Which endpoints exist (decision: several engine endpoints): every base URL of UPSTREAM_URL, a host name being one
 * endpoint per address, resolved again every UPSTREAM_DNS_REFRESH_MS and at once when health.ts asks, so a rollout is
 * followed in seconds. Each endpoint has its own undici Pool, hence its own connection bound and queue.
 */
import { lookup as dnsLookup, Resolver } from 'node:dns/promises'
import { isIP, type LookupFunction } from 'node:net'
import type { Client, Pool } from 'undici'

/** What the gateway needs of DNS: every address of a name (dns.promises.lookup with `all: true`). */
export interface Lookup {
  (hostname: string): Promise<ReadonlyArray<{ address: string; family: number }>>
  /** Give up the lookups in flight, so a silent server cannot keep the process alive after close. */
  cancel?: () => void
}

export const systemLookup: Lookup = async (hostname) => await dnsLookup(hostname, { all: true })

/** c-ares' wait for one server (doubled each round) and its rounds: a lost datagram costs a second, not the lookup. */
export const RESOLVER_TIMEOUT_MS = 1_000
export const RESOLVER_TRIES = 2

/**
 * UPSTREAM_DNS_SERVERS (Envoy's `dns_resolvers`): names asked of these servers with c-ares, not getaddrinfo, so no
 * libuv thread or libc cache stands between. AAAA only when the name has no A record, as preferredAddresses chooses.
 */
export function serversLookup (servers: readonly string[]): Lookup {
  const resolver = new Resolver({ timeout: RESOLVER_TIMEOUT_MS, tries: RESOLVER_TRIES })
  resolver.setServers(servers)
  const lookup = async (hostname: string): Promise<Array<{ address: string; family: number }>> => {
    try {
      return (await resolver.resolve4(hostname)).map((address) => ({ address, family: 4 }))
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENODATA') throw err
    }
    return (await resolver.resolve6(hostname)).map((address) => ({ address, family: 6 }))
  }
  // Pending queries fail with ECANCELLED; the resolver stays usable.
  return Object.assign(lookup, {
    cancel: () => {
      resolver.cancel()
    }
  })
}

/** `lookup` in net.connect's shape: a connection to a name not yet resolved asks UPSTREAM_DNS_SERVERS too. */
export function connectLookup (lookup: Lookup): LookupFunction {
  return (hostname, options, callback) => {
    const family =
      options.family === 4 || options.family === 'IPv4' ? 4 : options.family === 6 || options.family === 'IPv6' ? 6 : 0
    lookup(hostname).then(
      (found) => {
        const addresses = (preferredAddresses(found) ?? []).filter((a) => family === 0 || isIP(a) === family)
        const first = addresses[0]
        if (first === undefined) {
          // getaddrinfo's code for a name without an address: the upstream error map and the checks know it.
          callback(Object.assign(new Error(`lookup ENOTFOUND ${hostname}`), { code: 'ENOTFOUND', hostname }), '')
        } else if (options.all === true) {
          callback(
            null,
            addresses.map((address) => ({ address, family: isIP(address) }))
          )
        } else {
          callback(null, first, isIP(first))
        }
      },
      (err: NodeJS.ErrnoException) => {
        callback(err, '')
      }
    )
  }
}

/** Whether any of these base URLs names a host rather than an IP literal. */
export function namesAHost (urls: readonly string[]): boolean {
  return urls.some((url) => sourceOf(url).named)
}

export type PoolFactory = (origin: string) => Pool

/** Envoy's default DNS refresh rate (decision: several engine endpoints). */
export const DNS_REFRESH_MS = 5_000

/** The longest one lookup may take (or the refresh period, when shorter). */
export const LOOKUP_TIMEOUT_MS = 5_000

/** One address the gateway can send to: its pool, its load, and its health (health.ts writes those). */
export class Endpoint {
  /** host:port, the metrics label. */
  readonly key: string
  /** Calls on this endpoint that have not finished: what least-request compares. */
  inFlight = 0
  /** Tries given up in this pool's queue that undici has not dropped yet: not counted as queued. */
  abandonedQueued = 0
  /** In rotation: its health checks pass and it is not ejected (health.ts). */
  up = true
  // Passive outlier state (health.ts).
  consecutiveFailures = 0
  /** Envoy's ejection time multiplier. */
  ejectionBackoff = 0
  /** Date.now() from which its time in rotation counts toward the multiplier's decay. */
  upSince = 0
  ejections = 0
  ejected = false
  /** Date.now() at which the current ejection ends (EngineClient.status). */
  ejectedUntil = 0
  ejectionTimer: NodeJS.Timeout | undefined = undefined
  // Active health-check state (health.ts).
  checkedHealthy = true
  draining = false
  checkFailures = 0
  checkSuccesses = 0
  checking = false
  /** The health checks' own connection: never queued behind requests. */
  checker: Client | undefined = undefined
  /** The last connection attempt failed: skipped in panic, so an all-down cluster answers 502 at once. */
  unreachable = false
  /** Set once the endpoint has left the set: its pool closes when its calls are done. */
  removed = false
  /** Tries that timed out and keep their socket until the engine answers them (attempt.ts), and since when. */
  readonly held = new Map<{ drop: () => void }, number>()

  constructor (
    readonly origin: string,
    readonly pool: Pool,
    readonly hostHeader: string | undefined,
    key: string
  ) {
    this.key = key
  }

  /**
   * The engine answered a request sent at `sentAt` (performance.now()): it serves new work, so a try held since
   * before then is stuck there, not queued behind a busy engine, and its socket goes.
   */
  alive (sentAt: number): void {
    for (const [held, since] of this.held) if (since < sentAt) held.drop()
  }

  /**
   * The engine passed a check sent at `sentAt`: the oldest try held since before it gives its socket back, so the
   * next call can find out whether the engine serves requests again (its answer frees the rest, `alive`). One per
   * check, since an engine can answer /health at once while it is too slow for anything else.
   */
  checked (sentAt: number): void {
    // A Map iterates in insertion order: the first entry is the oldest hold.
    const oldest = this.held.entries().next().value
    if (oldest !== undefined && oldest[1] < sentAt) oldest[0].drop()
  }

  async retire (): Promise<void> {
    clearTimeout(this.ejectionTimer)
    // Nobody waits for a held try's answer; a check in flight is not worth waiting for either.
    for (const held of this.held.keys()) held.drop()
    await Promise.all([this.pool.close(), this.checker?.destroy()])
  }
}

/** One configured URL. */
interface Source {
  protocol: string
  hostname: string
  port: string
  /** The Host the engine expects: the name as configured. */
  host: string
  named: boolean
}

function sourceOf (url: string): Source {
  const u = new URL(url)
  const port = u.port !== '' ? u.port : u.protocol === 'https:' ? '443' : '80'
  const hostname = u.hostname.startsWith('[') ? u.hostname.slice(1, -1) : u.hostname
  return { protocol: u.protocol, hostname, port, host: u.host, named: isIP(hostname) === 0 }
}

const bracketed = (address: string): string => (isIP(address) === 6 ? `[${address}]` : address)

export interface EndpointSetOptions {
  urls: readonly string[]
  pool: PoolFactory
  lookup?: Lookup
  /** How often names are resolved again (DNS_REFRESH_MS, UPSTREAM_DNS_REFRESH_MS); 0: only when health.ts asks. */
  resolveIntervalMs?: number
  /** Told after every change of the set (endpoints added or removed). */
  onChange?: () => void
  /** Told once an endpoint that left the set has finished its calls, unless its address is back. */
  onRemoved?: (endpoint: Endpoint) => void
  /** Told after each lookup of a name, with its error if it failed. */
  onLookup?: (hostname: string, error: Error | undefined) => void
}

/**
 * A name's addresses as the gateway uses them: IPv4 only when it has any (Envoy's V4_PREFERRED, a choice of family,
 * not a fallback), so a dual-stack name is not two endpoints for one engine.
 */
export function preferredAddresses (found: ReadonlyArray<{ address: string; family: number }>): string[] | undefined {
  const v4 = found.filter((a) => isIP(a.address) === 4)
  const use = v4.length > 0 ? v4 : found.filter((a) => isIP(a.address) === 6)
  return use.length === 0 ? undefined : [...new Set(use.map((a) => a.address))].sort()
}

export class EndpointSet {
  /** The current endpoints, replaced (never mutated) when DNS changes, so a call sees one consistent set. */
  list: readonly Endpoint[]
  readonly #sources: readonly Source[]
  readonly #pool: PoolFactory
  readonly #lookup: Lookup
  readonly #onChange: (() => void) | undefined
  readonly #onRemoved: ((endpoint: Endpoint) => void) | undefined
  readonly #onLookup: ((hostname: string, error: Error | undefined) => void) | undefined
  readonly #timer: NodeJS.Timeout | undefined
  readonly #named: boolean
  #resolving: Promise<void> | undefined
  readonly #lookupTimeoutMs: number
  #closed = false

  constructor (opts: EndpointSetOptions) {
    this.#sources = opts.urls.map(sourceOf)
    this.#pool = opts.pool
    this.#lookup = opts.lookup ?? systemLookup
    this.#onChange = opts.onChange
    this.#onRemoved = opts.onRemoved
    this.#onLookup = opts.onLookup
    // Until a name is resolved, it is one endpoint by name that undici resolves per connection.
    this.list = this.#sources.map((s) => this.#make(s, s.hostname))
    this.#named = this.#sources.some((s) => s.named)
    const every = opts.resolveIntervalMs ?? DNS_REFRESH_MS
    this.#lookupTimeoutMs = every > 0 ? Math.min(every, LOOKUP_TIMEOUT_MS) : LOOKUP_TIMEOUT_MS
    if (this.#named) {
      this.#resolving = this.#run()
      if (every > 0) {
        this.#timer = setInterval(() => {
          this.resolveSoon()
        }, every).unref()
      }
    }
  }

  /** The first resolution of every name (tests and startup wait on it); resolved at once when there is none. */
  async ready (): Promise<void> {
    await this.#resolving
  }

  /** Resolve every name again now, unless a resolution is already in flight (health.ts asks). */
  resolveSoon (): void {
    if (this.#named && !this.#closed) this.#resolving ??= this.#run()
  }

  #make (s: Source, address: string): Endpoint {
    const origin = `${s.protocol}//${bracketed(address)}:${s.port}`
    // A name kept as Host only when the endpoint is an address the name resolved to.
    const hostHeader = s.named && address !== s.hostname ? s.host : undefined
    return new Endpoint(origin, this.#pool(origin), hostHeader, `${bracketed(address)}:${s.port}`)
  }

  /** Resolve every name again and apply the answer, after any resolution in flight (tests). */
  async resolve (): Promise<void> {
    while (this.#resolving !== undefined) await this.#resolving
    if (this.#closed) return
    this.#resolving = this.#run()
    await this.#resolving
  }

  /** Endpoints that stay keep their pool and health; a failed lookup keeps what the name had. */
  async #run (): Promise<void> {
    try {
      const answers = await Promise.all(
        this.#sources.map(async (s) => {
          if (!s.named) return undefined
          // A lookup that never settles must not hold `#resolving`, which would stop every later resolution.
          let timer: NodeJS.Timeout | undefined
          try {
            const deadline = new Promise<never>((_resolve, reject) => {
              // Unref'd: a lookup still pending at close must not hold the process for its deadline.
              timer = setTimeout(() => {
                reject(new Error('DNS lookup timed out'))
              }, this.#lookupTimeoutMs).unref()
            })
            const addresses = preferredAddresses(await Promise.race([this.#lookup(s.hostname), deadline]))
            if (addresses === undefined) throw new Error('no IPv4 or IPv6 address')
            if (!this.#closed) this.#onLookup?.(s.hostname, undefined)
            return addresses
          } catch (err) {
            // A lookup cancelled by close() is not a DNS failure to report.
            if (!this.#closed) this.#onLookup?.(s.hostname, err as Error)
            return undefined
          } finally {
            clearTimeout(timer)
          }
        })
      )
      if (this.#closed) return
      const byOrigin = new Map(this.list.map((e) => [e.origin, e]))
      const next: Endpoint[] = []
      this.#sources.forEach((s, i) => {
        const addresses = answers[i]
        if (addresses === undefined) {
          // An IP literal, or a name whose lookup failed: keep its endpoints as they are.
          for (const e of this.list) if (this.#belongsTo(e, s) && !next.includes(e)) next.push(e)
          if (!next.some((e) => this.#belongsTo(e, s))) {
            next.push(byOrigin.get(this.#make0(s)) ?? this.#make(s, s.hostname))
          }
          return
        }
        for (const address of addresses) {
          const origin = `${s.protocol}//${bracketed(address)}:${s.port}`
          const kept = byOrigin.get(origin)
          if (kept !== undefined && !next.includes(kept)) next.push(kept)
          else if (kept === undefined && !next.some((e) => e.origin === origin)) next.push(this.#make(s, address))
        }
      })
      const changed = next.length !== this.list.length || next.some((e, i) => e !== this.list[i])
      if (!changed) return
      const gone = this.list.filter((e) => !next.includes(e))
      this.list = next
      for (const e of gone) this.#retire(e)
      this.#onChange?.()
    } finally {
      this.#resolving = undefined
    }
  }

  #retire (e: Endpoint): void {
    e.removed = true
    e.retire()
      .catch(() => {})
      .finally(() => {
        // Back in the set by now (the address returned): its series stay with the new endpoint.
        if (!this.#closed && !this.list.some((other) => other.key === e.key)) this.#onRemoved?.(e)
      })
  }

  #make0 (s: Source): string {
    return `${s.protocol}//${bracketed(s.hostname)}:${s.port}`
  }

  #belongsTo (e: Endpoint, s: Source): boolean {
    if (!s.named) return e.origin === this.#make0(s)
    return e.hostHeader === s.host || e.origin === this.#make0(s)
  }

  async close (): Promise<void> {
    this.#closed = true
    clearInterval(this.#timer)
    this.#lookup.cancel?.()
    await Promise.all(
      this.list.map(async (e) => {
        await e.retire()
      })
    )
  }
}
