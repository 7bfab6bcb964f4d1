/**
 * GET /status on the metrics listener: what Envoy's `/clusters` or haproxy's
 * stats page give an operator at 3 a.m., as JSON. The version, the uptime,
 * whether the gateway drains, every engine endpoint with its state, the retry
 * budget in use, the shared store's mode and state, and the key set's state.
 * Never a secret: no URL (a Redis or key-set URL may carry a password or a
 * token), no key material, no token.
 *
 * The parts are read from their owners when the page is asked for, nothing is
 * kept per request. Their types live here, at the bottom, so each owner above
 * (engine-client, limits, auth) can say what it gives.
 */
import { readFileSync } from 'node:fs'

/** The engine cluster's state (EngineClient.status()). */
export interface EngineClusterStatus {
  endpoints: Array<{
    /** host:port, as the metrics label. */
    endpoint: string
    /** The host name from UPSTREAM_URL (or the IP). */
    name: string
    state: 'up' | 'ejected' | 'draining' | 'unreachable'
    /** ISO 8601 while ejected. */
    ejectedUntil: string | null
    ejections: number
    inFlight: number
  }>
  retryBudget: { retriesInFlight: number, callsInFlight: number, allowed: number }
}

/** The store of rate limits, idempotency records and upload leases (src/limits). */
export interface StoreStatus {
  mode: 'memory' | 'single' | 'sentinel' | 'cluster'
  /** The in-process store is always up. */
  state: 'starting' | 'up' | 'down'
  /** The servers, Sentinels or cluster nodes configured, as host:port (never a user or password). */
  nodes?: string[]
  /** Replication acknowledgements (DECISIONS 26): a master has a replica; paused after a miss until `pausedUntil`. */
  replication?: { replicated: boolean, pausedUntil: string | null }
}

/** The identity provider's key set (src/auth/key-set.ts): ids and algorithms only. */
export interface KeySetStatus {
  mode: 'jwks'
  keys: number
  kids: Array<{ kid: string | null, alg: string }>
  lastFetchOk: boolean
  lastAttempt: string | null
  lastFetch: string | null
  nextFetch: string | null
}

export interface GatewayStatus {
  version: string
  startedAt: string
  uptimeS: number
  draining: boolean
  engine: EngineClusterStatus
  store: StoreStatus
  /** A static key (JWT_SECRET, JWT_PUBLIC_KEY) has no fetch to report. */
  keySet: KeySetStatus | { mode: 'static' }
}

export interface StatusSources {
  version: string
  /** ms since the epoch. */
  startedAt: number
  lifecycle: { readonly draining: boolean }
  /** The engine client: its whole cluster view. */
  engine: { status: () => EngineClusterStatus }
  store: () => StoreStatus
  keySet?: { readonly status: KeySetStatus } | undefined
}

/** The snapshot, read now from each source. */
export function gatewayStatus (sources: StatusSources, now = Date.now()): GatewayStatus {
  return {
    version: sources.version,
    startedAt: new Date(sources.startedAt).toISOString(),
    uptimeS: Math.round((now - sources.startedAt) / 100) / 10,
    draining: sources.lifecycle.draining,
    engine: sources.engine.status(),
    store: sources.store(),
    keySet: sources.keySet?.status ?? { mode: 'static' }
  }
}

/** The gateway's version, from its package.json (found from src/ or dist/src/). */
export function gatewayVersion (): string {
  for (const up of ['../../package.json', '../../../package.json']) {
    try {
      const pkg = JSON.parse(readFileSync(new URL(up, import.meta.url), 'utf8')) as { name?: string, version?: string }
      if (pkg.name === 'portfolio-gateway' && pkg.version !== undefined) return pkg.version
    } catch {}
  }
  return 'unknown'
}
