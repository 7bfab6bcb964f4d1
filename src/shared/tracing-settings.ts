/** OpenTelemetry's standard variables read into settings (decision: traces), without loading the SDK. */
import type { OtelEnv } from '../../schemas/env.js'

export type SamplerName =
  | 'always_on' |
  'always_off' |
  'traceidratio' |
  'parentbased_always_on' |
  'parentbased_always_off' |
  'parentbased_traceidratio'

export interface TracingSettings {
  readonly url: string
  /** A secret: never logged, never quoted in an error. */
  readonly headers: Readonly<Record<string, string>>
  readonly serviceName: string
  readonly resourceAttributes: Readonly<Record<string, string>>
  readonly sampler: SamplerName
  readonly ratio: number
}

export type TracingSettingsResult =
  { readonly ok: true; readonly value: TracingSettings | undefined } | { readonly ok: false; readonly message: string }

/** Of new traces; a parent's decision is followed. */
export const DEFAULT_SAMPLING_RATIO = 0.01

/** An HTTP header name (RFC 9110 token). */
const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/

/** Read by this process itself; every other exporter variable that reaches traces is refused. */
const SUPPORTED_OTLP = new Set([
  'OTEL_EXPORTER_OTLP_ENDPOINT',
  'OTEL_EXPORTER_OTLP_TRACES_ENDPOINT',
  'OTEL_EXPORTER_OTLP_HEADERS',
  'OTEL_EXPORTER_OTLP_TRACES_HEADERS'
])
/** Read by the OTLP exporter from process.env behind our back. */
const READ_BY_EXPORTER = /^OTEL_EXPORTER_OTLP_(?!METRICS_|LOGS_)[A-Z_]+$/

type Problem = { readonly ok: false; readonly message: string }

/**
 * Undefined when neither endpoint variable is set. OTLP variables in `raw` that the exporter would read on its own
 * are refused, since a value it cannot use would be dropped without a word.
 */
export function tracingSettingsOf (
  env: OtelEnv,
  defaultServiceName: string,
  raw: Readonly<Record<string, string | undefined>> = {}
): TracingSettingsResult {
  const url = endpointOf(env)
  if (url === undefined) return { ok: true, value: undefined }
  if (typeof url !== 'string') return url
  const unsupported = unsupportedProblem(raw)
  if (unsupported !== undefined) return unsupported
  const headers = headersOf(env)
  if (!headers.ok) return headers
  const resource = keyValues(env.OTEL_RESOURCE_ATTRIBUTES)
  if (!resource.ok) {
    return {
      ok: false,
      message: `OTEL_RESOURCE_ATTRIBUTES is invalid: entry ${resource.entry} is not key=value with a ` +
        'percent-encoded value; expected comma-separated key=value, e.g. deployment.environment.name=production'
    }
  }
  const ratio = env.OTEL_TRACES_SAMPLER_ARG === undefined ? DEFAULT_SAMPLING_RATIO : Number(env.OTEL_TRACES_SAMPLER_ARG)
  // The OpenTelemetry specification: OTEL_SERVICE_NAME wins over a service.name in OTEL_RESOURCE_ATTRIBUTES.
  const serviceName = env.OTEL_SERVICE_NAME ?? resource.value['service.name'] ?? defaultServiceName
  return {
    ok: true,
    value: Object.freeze({
      url,
      headers: Object.freeze(headers.value),
      serviceName,
      resourceAttributes: Object.freeze(resource.value),
      sampler: env.OTEL_TRACES_SAMPLER as SamplerName,
      ratio
    })
  }
}

function endpointOf (env: OtelEnv): string | Problem | undefined {
  const url =
    env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT ??
    (env.OTEL_EXPORTER_OTLP_ENDPOINT === undefined
      ? undefined
      : `${env.OTEL_EXPORTER_OTLP_ENDPOINT.replace(/\/+$/, '')}/v1/traces`)
  if (url === undefined) return undefined
  const endpointName =
    env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT === undefined
      ? 'OTEL_EXPORTER_OTLP_ENDPOINT'
      : 'OTEL_EXPORTER_OTLP_TRACES_ENDPOINT'
  if (!URL.canParse(url)) {
    return {
      ok: false,
      message: `${endpointName}=${JSON.stringify(url.replace(/\/\/[^/@]*@/, '//(credentials hidden)@'))} ` +
        'is invalid: not a URL; expected the collector\'s OTLP/HTTP URL, e.g. http://jaeger:4318'
    }
  }
  return url
}

function unsupportedProblem (raw: Readonly<Record<string, string | undefined>>): Problem | undefined {
  const unsupported = Object.keys(raw)
    .sort()
    .find(
      (name) => READ_BY_EXPORTER.test(name) && !SUPPORTED_OTLP.has(name) && raw[name] !== undefined && raw[name] !== ''
    )
  if (unsupported === undefined) return undefined
  // Named, never quoted: it may be a key or a header.
  return {
    ok: false,
    message: `${unsupported} is not supported: unset it; traces go over OTLP/HTTP with protobuf, uncompressed, with ` +
      `fixed timeouts, and only ${[...SUPPORTED_OTLP].join(', ')} are read (https:// uses the system's CAs)`
  }
}

function headersOf (env: OtelEnv): { ok: true, value: Record<string, string> } | Problem {
  const headers: Record<string, string> = {}
  for (const name of ['OTEL_EXPORTER_OTLP_HEADERS', 'OTEL_EXPORTER_OTLP_TRACES_HEADERS'] as const) {
    const list = keyValues(env[name])
    if (!list.ok) {
      // The values are credentials: the message names the entry by position only.
      return {
        ok: false,
        message: `${name} is invalid: entry ${list.entry} is not key=value with a percent-encoded ` +
          'value; expected comma-separated key=value, e.g. authorization=Bearer%20abc'
      }
    }
    const badHeader = Object.keys(list.value).findIndex((key) => !TOKEN.test(key))
    if (badHeader !== -1) {
      return {
        ok: false,
        message: `${name} is invalid: entry ${badHeader + 1} does not name an HTTP header; ` +
          'expected comma-separated key=value, e.g. authorization=Bearer%20abc'
      }
    }
    // The OpenTelemetry specification: the signal's own list wins, header by header.
    Object.assign(headers, list.value)
  }
  return { ok: true, value: headers }
}

/** The W3C Baggage-like list of the OpenTelemetry specification. */
function keyValues (
  text: string | undefined
): { ok: true; value: Record<string, string> } | { ok: false; entry: number } {
  const value: Record<string, string> = {}
  if (text === undefined) return { ok: true, value }
  const entries = text.split(',')
  for (let i = 0; i < entries.length; i++) {
    const entry = entries[i]!
    const eq = entry.indexOf('=')
    const key = eq === -1 ? '' : entry.slice(0, eq).trim()
    if (key === '') return { ok: false, entry: i + 1 }
    try {
      value[key] = decodeURIComponent(entry.slice(eq + 1).trim())
    } catch {
      return { ok: false, entry: i + 1 }
    }
  }
  return { ok: true, value }
}
