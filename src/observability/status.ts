/**
 * GET /status on the metrics listener: what Envoy's `/clusters` gives an operator, as JSON. Never a secret: no URL
 * (it may carry a password), no key material, no token. The types live here, in the lowest layer, so each owner above
 * can say what it gives.
 */
import { readFileSync } from 'node:fs'

export interface EngineClusterStatus {
  endpoints: Array<{
    endpoint: string
    name: string
    state: 'up' | 'ejected' | 'draining' | 'unreachable'
    ejectedUntil: string | null
    ejections: number
    inFlight: number
  }>
  retryBudget: { retriesInFlight: number, callsInFlight: number, allowed: number }
}

export interface StoreStatus {
  mode: 'memory' | 'single' | 'sentinel' | 'cluster'
  state: 'starting' | 'up' | 'down'
  /** host:port only, never a user or password. */
  nodes?: string[]
  /** Replication acknowledgements, paused after a miss until `pausedUntil`. */
  replication?: { replicated: boolean, pausedUntil: string | null }
}

/** The identity provider's key set: ids and algorithms only. */
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
  startedAt: number
  lifecycle: { readonly draining: boolean }
  engine: { status: () => EngineClusterStatus }
  store: () => StoreStatus
  keySet?: { readonly status: KeySetStatus } | undefined
}

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
