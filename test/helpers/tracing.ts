/**
 * A traced gateway in front of a traced reference engine, both exporting to an
 * OTLP/HTTP receiver the test owns (bench/otlp-sink.ts, its own protobuf decoder).
 */
import type { Test } from 'tap'
import { OtelEnv } from '../../schemas/env.js'
import { readEnv } from '../../src/shared/env.js'
import { tracingSettingsOf } from '../../src/shared/tracing-settings.js'
import { startTracing, type Tracing, type TracingTuning } from '../../src/shared/tracing-sdk.js'
import { startOtlpSink, type DecodedSpan, type OtlpSink } from '../../bench/otlp-sink.js'
import { build, type BuildOptions, type Built } from './app.js'
import { startEngine } from './engine.js'

/** Exports leave 20 ms after a span ends, so a test waits on arrivals, not on the 1 s default. */
export const FAST_EXPORT: TracingTuning = { exportDelayMs: 20 }

/** A provider as server.ts makes one, from OTEL_* variables. */
export function tracingFrom (
  t: Test,
  env: Record<string, string>,
  service: string,
  tuning: TracingTuning = FAST_EXPORT,
  opts: { followCaller?: boolean } = {}
): Tracing {
  const read = readEnv(OtelEnv, env)
  if (!read.ok) throw new Error(`${read.name}: ${read.problem}`)
  const settings = tracingSettingsOf(read.value, service)
  if (!settings.ok || settings.value === undefined) throw new Error(settings.ok ? 'no endpoint' : settings.message)
  const tracing = startTracing(settings.value, tuning, opts)
  t.teardown(async () => {
    await tracing.shutdown(1_000)
  })
  return tracing
}

export interface TracedPair {
  sink: OtlpSink
  gateway: Built
  gatewayTracing: Tracing
  engineTracing: Tracing
  engineOrigin: string
}

/** Sink, traced engine, traced gateway; `env` adds OTEL_* settings (sampler etc.) for both; `upstreams` makes
 * UPSTREAM_URL's list from the engine's origin.
 */
export async function tracedPair (
  t: Test,
  env: Record<string, string> = {},
  opts: BuildOptions = {},
  upstreams?: (origin: string) => string[]
): Promise<TracedPair> {
  const sink = await startOtlpSink()
  t.teardown(async () => {
    await sink.close()
  })
  const otel = { OTEL_EXPORTER_OTLP_ENDPOINT: sink.url, ...env }
  // As the engine runs (server.ts, standalone.ts): it only serves gateways, so it follows their flag.
  const engineTracing = tracingFrom(t, otel, 'portfolio-engine', FAST_EXPORT, { followCaller: true })
  const engine = await startEngine(t, { tracer: engineTracing.tracer })
  const gatewayTracing = tracingFrom(t, otel, 'portfolio-gateway')
  const gateway = await build(t, {
    upstreamUrl: engine.origin,
    ...opts,
    ...(upstreams === undefined ? {} : { upstreamUrls: upstreams(engine.origin) }),
    env: { ...otel, ...opts.env },
    tracing: gatewayTracing
  })
  return { sink, gateway, gatewayTracing, engineTracing, engineOrigin: engine.origin }
}

export const ofTrace = (spans: DecodedSpan[], traceId: string): DecodedSpan[] =>
  spans.filter((s) => s.traceId === traceId)
/**
 * Whether the instant `later` is not before `earlier`, as two spans' times can
 * show it. The SDK stamps a span's start with Date.now() (whole milliseconds)
 * and its end as that start plus a sub-millisecond duration, so of two spans
 * in true order the second's start may read up to 1 ms before the first's end.
 */
export const notBefore = (later: bigint, earlier: bigint): boolean => later + 1_000_000n >= earlier
export const SERVER = 2
export const CLIENT = 3

/** A sampled traceparent from "the client", with ids the test knows. */
export function clientTraceparent (sampled = true): { header: string; traceId: string; parentId: string } {
  const traceId = [...Array(32)]
    .map(() => Math.floor(Math.random() * 16).toString(16))
    .join('')
    .replace(/^./, 'a')
  const parentId = [...Array(16)]
    .map(() => Math.floor(Math.random() * 16).toString(16))
    .join('')
    .replace(/^./, 'b')
  return { header: `00-${traceId}-${parentId}-${sampled ? '01' : '00'}`, traceId, parentId }
}
