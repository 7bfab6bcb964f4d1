/**
 * The one place the gateway's parts are built and handed what they use, so the process, the tests and the bench
 * start the same gateway and stop it with one close().
 */
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { FastifyInstance } from 'fastify'
import pino, { type DestinationStream, type LoggerOptions } from 'pino'
import { buildApp, type AppDeps } from './app.js'
import { loadKeySet, type KeySetBounds } from './auth/jwt.js'
import type { KeySet } from './auth/key-set.js'
import type { GatewayConfig } from './config.js'
import { EngineClient, type EnginePoolOptions } from './engine-client/client.js'
import { namesAHost, serversLookup } from './engine-client/endpoints.js'
import { openLimitStore } from './limits/limits.js'
import type { GatewayMetrics } from './observability/metrics.js'
import { observedMetrics } from './observability/request-metrics.js'
import type { StatusSources } from './observability/status.js'
import { buildEngine } from './reference-engine/engine.js'
import type { Lifecycle } from './routes/health.js'
import type { Tracing } from './shared/tracing-sdk.js'

export type LogOptions = LoggerOptions & { stream?: DestinationStream }

/** What a caller may set beyond the config: the process's logger, and what tests shorten or inject. */
export interface ComposeOverrides {
  log?: LogOptions
  lifecycle?: Lifecycle
  /** Engine pool settings on top of the config's (tests: a small pool, short keep-alive, an injected lookup). */
  engine?: Partial<EnginePoolOptions>
  /** A tracing provider the caller started and will shut down; absent: started here when the config asks. */
  tracing?: Tracing
  keySet?: KeySetBounds
  /** The request path's timings that tests shorten. */
  app?: Pick<AppDeps, 'uploadStallTimeoutMs' | 'uploadMinRate' | 'linger'>
}

export interface Gateway {
  app: FastifyInstance
  engine: EngineClient
  metrics: GatewayMetrics
  keySet: KeySet | undefined
  lifecycle: Lifecycle
  /** What GET /status reads from the parts (the version and start time are the process's). */
  status: Omit<StatusSources, 'version' | 'startedAt'>
  /** The reference engine this process runs when UPSTREAM_URL is unset; else undefined. */
  embeddedEngineUrl: string | undefined
  /** Closes the app (after its requests in flight), then every part, last built first. Idempotent. */
  close: () => Promise<void>
}

/** How long the last spans get to leave on close: a dead collector never holds the exit up longer. */
const TRACE_FLUSH_MS = 2_000

export function engineClientOptions (config: GatewayConfig, url: string | readonly string[]): EnginePoolOptions {
  return {
    url,
    timeoutMs: config.upstreamTimeoutMs,
    tryTimeoutMs: config.upstreamTryTimeoutMs,
    maxQueue: config.limits.upstreamMaxQueue,
    resolveIntervalMs: config.upstreamDnsRefreshMs,
    // With UPSTREAM_DNS_SERVERS the connections to a name ask those servers too: the system resolver
    // may not know a name only they serve (a cluster DNS the host does not use).
    ...(config.upstreamDnsServers === undefined
      ? {}
      : { lookup: serversLookup(config.upstreamDnsServers), connectWithLookup: true })
  }
}

export async function compose (config: GatewayConfig, overrides: ComposeOverrides = {}): Promise<Gateway> {
  const parts = new Parts()
  try {
    return await assemble(config, overrides, parts)
  } catch (err) {
    await parts.close()
    throw err
  }
}

async function assemble (config: GatewayConfig, overrides: ComposeOverrides, parts: Parts): Promise<Gateway> {
  const { stream, ...logOptions } = overrides.log ?? { enabled: false }
  const log = pino(logOptions, stream)
  const tracing = overrides.tracing ?? await startTracing(config, parts)
  const embedded = config.upstreamUrl === undefined
    ? await startEmbeddedEngine(config, overrides.log, parts)
    : undefined

  const url = config.upstreamUrls ?? embedded!
  const engine = new EngineClient({ ...engineClientOptions(config, url), ...overrides.engine })
  parts.add(async () => { await engine.close() })
  // A name is resolved in the background, so a slow DNS never holds up start-up; with UPSTREAM_DNS_SERVERS
  // the gateway waits for their first answers (at most the lookup deadline), and listens anyway if none come.
  if (config.upstreamDnsServers !== undefined) await engine.ready()
  if (config.upstreamDnsServers !== undefined && !namesAHost(config.upstreamUrls ?? [])) {
    log.warn({ upstreamDnsServers: config.upstreamDnsServers },
      'UPSTREAM_DNS_SERVERS is set, but UPSTREAM_URL names no host (only IP addresses, or unset): ' +
      'nothing is resolved, the servers are never asked')
  }

  const { metrics, stop } = observedMetrics(engine, { perCall: config.metricsPort !== 0 })
  parts.add(async () => { stop() })
  if (tracing !== undefined) tracing.onDropped = (count) => { metrics.spansDropped(count) }
  const store = await openLimitStore(config.limits, { log, metrics })
  parts.add(async () => { await store.close() })
  const keySet = config.jwt.source === 'jwks'
    ? await loadKeySet(config.jwt, { log, metrics, bounds: overrides.keySet })
    : undefined
  if (keySet !== undefined) parts.add(async () => { keySet.close() })

  const lifecycle = overrides.lifecycle ?? { draining: false }
  const deps = { ...overrides.app, engine, metrics, store, keySet, logger: log, lifecycle, tracing }
  const app = await buildApp(config, deps)
  parts.add(async () => { await app.close() })
  return {
    app,
    engine,
    metrics,
    keySet,
    lifecycle,
    status: { lifecycle, engine, store: () => store.status(), keySet },
    embeddedEngineUrl: embedded,
    close: async () => { await parts.close() }
  }
}

/** Without an OTLP endpoint the tracing SDK is not even loaded. */
async function startTracing (config: GatewayConfig, parts: Parts): Promise<Tracing | undefined> {
  if (config.tracing === undefined) return undefined
  const tracing = (await import('./shared/tracing-sdk.js')).startTracing(config.tracing)
  parts.add(async () => { await tracing.shutdown(TRACE_FLUSH_MS) })
  return tracing
}

/**
 * The reference engine in this process, on loopback only, with an image folder of its own that goes
 * when the gateway closes; traced too when tracing is on, as its own service under the gateway's tries.
 */
async function startEmbeddedEngine (config: GatewayConfig, log: LogOptions | undefined, parts: Parts): Promise<string> {
  const imageDir = await mkdtemp(join(tmpdir(), 'portfolio-gateway-engine-'))
  parts.add(async () => { await rm(imageDir, { recursive: true, force: true }) })
  let tracer
  if (config.tracing !== undefined) {
    const settings = { ...config.tracing, serviceName: 'portfolio-engine' }
    const tracing = (await import('./shared/tracing-sdk.js')).startTracing(settings, {}, { followCaller: true })
    parts.add(async () => { await tracing.shutdown(TRACE_FLUSH_MS) })
    tracer = tracing.tracer
  }
  const logger = log === undefined ? false : { ...log, name: 'engine' }
  const engine = await buildEngine({ imageDir, logger, ...(tracer === undefined ? {} : { tracer }) })
  parts.add(async () => { await engine.close() })
  return await engine.listen({ port: 0, host: '127.0.0.1' })
}

/** The closes of the parts built so far, run last first, once. */
class Parts {
  readonly #closes: Array<() => Promise<void>> = []
  #closed: Promise<void> | undefined

  add (close: () => Promise<void>): void {
    this.#closes.push(close)
  }

  async close (): Promise<void> {
    this.#closed ??= this.#closeAll()
    await this.#closed
  }

  async #closeAll (): Promise<void> {
    let failure: unknown
    for (const close of this.#closes.reverse()) {
      try {
        await close()
      } catch (err) {
        failure ??= err
      }
    }
    if (failure !== undefined) throw failure
  }
}
