/**
 * The OpenTelemetry SDK for one process (DECISIONS 29): a tracer provider
 * that exports over OTLP/HTTP (protobuf), bounded and lossy by design.
 *
 * Nothing is registered globally: no global tracer provider, no context
 * manager (AsyncLocalStorage), no propagator. Callers hand the parent context
 * to each span themselves, so a request pays for the spans it makes and
 * nothing else. The gateway and the standalone engine import this module only
 * when an endpoint is configured.
 *
 * Bounds: at most QUEUE_MAX finished spans wait or travel at once (queued,
 * plus those in an export not yet answered); a span past that is dropped at
 * once, and so is every span of a batch the collector refused, could not be
 * reached for, or did not answer within EXPORT_TIMEOUT_MS, and of the batches
 * that follow such a failure while the exporter backs off. Each drop is
 * counted (`onDropped`). A dead or hanging collector therefore costs a
 * request nothing but a counter increment, and memory stays bounded.
 */
import {
  ROOT_CONTEXT,
  SpanKind,
  trace,
  type Attributes,
  type Context,
  type Link,
  type Tracer
} from '@opentelemetry/api'
import { ExportResultCode, type ExportResult } from '@opentelemetry/core'
import { resourceFromAttributes } from '@opentelemetry/resources'
import {
  AlwaysOffSampler,
  AlwaysOnSampler,
  BatchSpanProcessor,
  ParentBasedSampler,
  RandomIdGenerator,
  SamplingDecision,
  TraceIdRatioBasedSampler,
  TracerProvider,
  type IdGenerator,
  type ReadableSpan,
  type Sampler,
  type SamplingResult,
  type SpanExporter,
  type SpanProcessor,
  type Span as SdkSpan
} from '@opentelemetry/sdk-trace'
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto'
import { ATTR_SERVICE_NAME } from '@opentelemetry/semantic-conventions'
import type { TracingSettings } from './tracing-settings.js'
import { DECIDED, NEW_TRACE_RECORDED } from './tracing-spans.js'

/** Finished spans held at most (queued or in an unanswered export). */
export const QUEUE_MAX = 2048
/** Spans per OTLP request. */
export const BATCH_MAX = 512
/** How long finished spans gather before an export. */
export const EXPORT_DELAY_MS = 1_000
/** One export, retries included, is given up after this (its spans are dropped and counted). */
export const EXPORT_TIMEOUT_MS = 5_000

export interface Tracing {
  readonly tracer: Tracer
  /** Told how many spans were dropped, each time some are (the gateway counts them in a metric). */
  onDropped: (count: number) => void
  /**
   * The trace id of the next span started without a parent, instead of a
   * random one: the gateway sets it to the id its log lines already carry.
   */
  nextTraceId: string | undefined
  /**
   * The sampling decision for a server span under `parent` (a trusted caller's
   * span context), or for a new trace when `parent` is ROOT_CONTEXT, made before
   * any span exists: undefined when it is not recorded (nothing more is built for
   * the request), else the context to start the span in, which carries the
   * decision so the span's own sampling returns it unchanged (one decision per
   * request). A new trace is decided on `ownTraceId`, the id this process gave
   * it, as OpenTelemetry JS's ratio sampler decides; without one (the id is an
   * untrusted client's, who could pick it), by a random draw.
   */
  decide: (parent: Context, ownTraceId?: string) => Context | undefined
  /** Spans finished and not yet exported or dropped (tests). */
  readonly pending: number
  /** Export what is queued, within `timeoutMs`, then stop; spans still queued then are dropped. */
  shutdown: (timeoutMs: number) => Promise<void>
}

export interface TracingTuning {
  queueMax?: number
  exportDelayMs?: number
  exportTimeoutMs?: number
}

/** The provider for `settings`: an exporter, a bounded batch processor, the sampler. */
export function startTracing (
  settings: TracingSettings,
  tuning: TracingTuning = {},
  opts: { followCaller?: boolean } = {}
): Tracing {
  const queueMax = tuning.queueMax ?? QUEUE_MAX
  const exportTimeoutMs = tuning.exportTimeoutMs ?? EXPORT_TIMEOUT_MS
  const state = { pending: 0, onDropped: (_count: number): void => {} }
  const exporter = new CountingExporter(
    new OTLPTraceExporter({
      url: settings.url,
      headers: { ...settings.headers },
      timeoutMillis: exportTimeoutMs,
      // One export at a time leaves the batch processor; the rest are retries and flushes.
      concurrencyLimit: 4
    }),
    state
  )
  const batches = new BatchSpanProcessor({
    exporter,
    maxQueueSize: queueMax,
    maxExportBatchSize: Math.min(BATCH_MAX, queueMax),
    scheduledDelayMillis: tuning.exportDelayMs ?? EXPORT_DELAY_MS,
    // Past the exporter's own timeout, so the exporter answers first and its spans are counted.
    exportTimeoutMillis: exportTimeoutMs + 1_000
  })
  const ids = new GivenTraceIds()
  const sampler = samplerOf(settings, opts.followCaller === true)
  const recordsNewTrace = newTraceDecision(settings)
  const provider = new TracerProvider({
    idGenerator: ids,
    resource: resourceFromAttributes({ ...settings.resourceAttributes, [ATTR_SERVICE_NAME]: settings.serviceName }),
    sampler: new DecidedFirst(sampler),
    spanProcessors: [new BoundedSpanProcessor(batches, queueMax, state)]
  })
  const tracer = provider.getTracer('portfolio-gateway')
  return {
    tracer,
    get onDropped () {
      return state.onDropped
    },
    set onDropped (fn) {
      state.onDropped = fn
    },
    get nextTraceId () {
      return ids.next
    },
    set nextTraceId (id) {
      ids.next = id
    },
    decide: (parent, ownTraceId) => {
      if (parent === ROOT_CONTEXT) return recordsNewTrace(ownTraceId) ? NEW_TRACE_RECORDED : undefined
      const decided = sampler.shouldSample(
        parent,
        trace.getSpanContext(parent)?.traceId ?? '',
        '',
        SpanKind.SERVER,
        {},
        []
      )
      return decided.decision === SamplingDecision.NOT_RECORD ? undefined : parent.setValue(DECIDED, decided)
    },
    get pending () {
      return state.pending
    },
    shutdown: async (timeoutMs) => {
      let timer: NodeJS.Timeout | undefined
      const bound = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, timeoutMs)
      })
      try {
        await Promise.race([provider.shutdown().catch(() => {}), bound])
      } finally {
        clearTimeout(timer)
      }
    }
  }
}

/** Random ids, except a trace id given beforehand (taken once). */
class GivenTraceIds implements IdGenerator {
  next: string | undefined = undefined
  readonly #random = new RandomIdGenerator()

  generateTraceId (): string {
    const given = this.next
    this.next = undefined
    return given ?? this.#random.generateTraceId()
  }

  generateSpanId (): string {
    return this.#random.generateSpanId()
  }
}

class DecidedFirst implements Sampler {
  constructor (readonly inner: Sampler) {}

  shouldSample (
    context: Context,
    traceId: string,
    name: string,
    kind: SpanKind,
    attributes: Attributes,
    links: Link[]
  ): SamplingResult {
    return (
      (context.getValue(DECIDED) as SamplingResult | undefined) ??
      this.inner.shouldSample(context, traceId, name, kind, attributes, links)
    )
  }

  toString (): string {
    return this.inner.toString()
  }
}

/**
 * The configured sampler, for a trusted parent's requests (the gateway) and
 * every span of the standalone engine. `followCaller` (the engine, which only
 * gateways call): plain `traceidratio` follows the caller's flag too, since it
 * would otherwise decide on a trace id an untrusted client may have picked,
 * which the gateway passes on unrecorded.
 */
function samplerOf (settings: TracingSettings, followCaller: boolean): Sampler {
  const ratio = new TraceIdRatioBasedSampler(settings.ratio)
  switch (settings.sampler) {
    case 'always_on':
      return new AlwaysOnSampler()
    case 'always_off':
      return new AlwaysOffSampler()
    case 'traceidratio':
      return followCaller ? new ParentBasedSampler({ root: ratio }) : ratio
    case 'parentbased_always_on':
      return new ParentBasedSampler({ root: new AlwaysOnSampler() })
    case 'parentbased_always_off':
      return new ParentBasedSampler({ root: new AlwaysOffSampler() })
    case 'parentbased_traceidratio':
      return new ParentBasedSampler({ root: ratio })
  }
}

/**
 * Whether a new trace is recorded: the sampler's root decision, on the trace id
 * this process gave it (OpenTelemetry JS's ratio sampler, so a service on that
 * SDK sampling on the id decides alike; other SDKs read other bits of the id),
 * or by a random draw when the id came from a client outside TRUST_PROXY: such
 * a request's trace id is kept, but neither its sampled flag nor its id (which
 * the client picks) has a say; otherwise any client could have every request
 * it sends recorded and exported. Envoy follows the client's flag
 * (envoyproxy/envoy#35721); an edge should not.
 */
function newTraceDecision (settings: TracingSettings): (ownTraceId: string | undefined) => boolean {
  switch (settings.sampler) {
    case 'always_on':
    case 'parentbased_always_on':
      return () => true
    case 'always_off':
    case 'parentbased_always_off':
      return () => false
    case 'traceidratio':
    case 'parentbased_traceidratio': {
      const ratio = settings.ratio
      const byId = new TraceIdRatioBasedSampler(ratio)
      return (id) =>
        id === undefined
          ? Math.random() < ratio
          : byId.shouldSample(ROOT_CONTEXT, id).decision !== SamplingDecision.NOT_RECORD
    }
  }
}

interface Pending {
  pending: number
  onDropped: (count: number) => void
}

/** The gate in front of the batch processor: past `max` spans held, a span is dropped and counted. */
class BoundedSpanProcessor implements SpanProcessor {
  constructor (
    readonly inner: SpanProcessor,
    readonly max: number,
    readonly state: Pending
  ) {}

  onStart (_span: SdkSpan, _parent: Context): void {}

  onEnd (span: ReadableSpan): void {
    if ((span.spanContext().traceFlags & 1) === 0) return
    if (this.state.pending >= this.max) {
      this.state.onDropped(1)
      return
    }
    this.state.pending++
    this.inner.onEnd(span)
  }

  async forceFlush (): Promise<void> {
    await this.inner.forceFlush()
  }

  async shutdown (): Promise<void> {
    await this.inner.shutdown()
  }
}

/** After a failed export, batches are dropped without an attempt for this long, doubling up to BACKOFF_MAX_MS. */
export const BACKOFF_MIN_MS = 1_000
export const BACKOFF_MAX_MS = 30_000

/**
 * Counts each batch out of `pending` when the exporter answers, and as
 * dropped when it failed. After a failure the collector is left alone for a
 * while (1 s, doubling to 30 s, reset by a success): batches in that time are
 * dropped at once, so a dead collector costs no encoding, no connection
 * attempts and no retries while it stays dead.
 */
class CountingExporter implements SpanExporter {
  #backoffMs = 0
  #resumeAt = 0

  constructor (
    readonly inner: SpanExporter,
    readonly state: Pending
  ) {}

  export (spans: ReadableSpan[], done: (result: ExportResult) => void): void {
    if (this.#backoffMs !== 0 && performance.now() < this.#resumeAt) {
      this.state.pending -= spans.length
      this.state.onDropped(spans.length)
      done({ code: ExportResultCode.FAILED })
      return
    }
    let answered = false
    this.inner.export(spans, (result) => {
      if (answered) return
      answered = true
      this.state.pending -= spans.length
      if (result.code === ExportResultCode.SUCCESS) {
        this.#backoffMs = 0
      } else {
        this.state.onDropped(spans.length)
        this.#backoffMs = Math.min(BACKOFF_MAX_MS, this.#backoffMs === 0 ? BACKOFF_MIN_MS : this.#backoffMs * 2)
        this.#resumeAt = performance.now() + this.#backoffMs
      }
      done(result)
    })
  }

  async shutdown (): Promise<void> {
    // Spans still held when the exporter stops never leave: counted as dropped.
    if (this.state.pending > 0) this.state.onDropped(this.state.pending)
    this.state.pending = 0
    await this.inner.shutdown()
  }

  async forceFlush (): Promise<void> {
    await this.inner.forceFlush?.()
  }
}
