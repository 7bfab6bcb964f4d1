/**
 * The OpenTelemetry SDK for one process (decision: traces), bounded and lossy by design, so a dead or hanging
 * collector costs a request only a counter increment. Nothing is registered globally (no context manager or
 * propagator): callers hand each span its parent, so a request pays only for the spans it makes.
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

/** Finished spans held at most, queued or in an unanswered export; past it a span is dropped and counted. */
export const QUEUE_MAX = 2048
export const BATCH_MAX = 512
export const EXPORT_DELAY_MS = 1_000
/** One export, retries included, is given up after this. */
export const EXPORT_TIMEOUT_MS = 5_000

export interface Tracing {
  readonly tracer: Tracer
  /** Told how many spans were dropped, each time some are. */
  onDropped: (count: number) => void
  /** The gateway sets it to the id its log lines already carry, for the next span without a parent. */
  nextTraceId: string | undefined
  /**
   * Decided before any span exists, so an unrecorded request builds nothing: undefined, or the context to start the
   * span in, carrying the decision. Without `ownTraceId` (a client's id, which it could pick) a new trace is a draw.
   */
  decide: (parent: Context, ownTraceId?: string) => Context | undefined
  /** Spans finished and not yet exported or dropped. */
  readonly pending: number
  /** Spans still queued after `timeoutMs` are dropped. */
  shutdown: (timeoutMs: number) => Promise<void>
}

export interface TracingTuning {
  queueMax?: number
  exportDelayMs?: number
  exportTimeoutMs?: number
}

/** An exporter, a bounded batch processor and the sampler. */
export function startTracing (
  settings: TracingSettings,
  tuning: TracingTuning = {},
  opts: { followCaller?: boolean } = {}
): Tracing {
  const state = { pending: 0, onDropped: (_count: number): void => {} }
  const ids = new GivenTraceIds()
  const sampler = samplerOf(settings, opts.followCaller === true)
  const recordsNewTrace = newTraceDecision(settings)
  const provider = providerOf(settings, tuning, { state, ids, sampler })
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
    shutdown: async (timeoutMs) => { await shutdownWithin(provider, timeoutMs) }
  }
}

function providerOf (
  settings: TracingSettings,
  tuning: TracingTuning,
  parts: { state: Pending, ids: IdGenerator, sampler: Sampler }
): TracerProvider {
  const queueMax = tuning.queueMax ?? QUEUE_MAX
  const exportTimeoutMs = tuning.exportTimeoutMs ?? EXPORT_TIMEOUT_MS
  const exporter = new CountingExporter(
    new OTLPTraceExporter({
      url: settings.url,
      headers: { ...settings.headers },
      timeoutMillis: exportTimeoutMs,
      // One export at a time leaves the batch processor; the rest are retries and flushes.
      concurrencyLimit: 4
    }),
    parts.state
  )
  const batches = new BatchSpanProcessor({
    exporter,
    maxQueueSize: queueMax,
    maxExportBatchSize: Math.min(BATCH_MAX, queueMax),
    scheduledDelayMillis: tuning.exportDelayMs ?? EXPORT_DELAY_MS,
    // Past the exporter's own timeout, so the exporter answers first and its spans are counted.
    exportTimeoutMillis: exportTimeoutMs + 1_000
  })
  return new TracerProvider({
    idGenerator: parts.ids,
    resource: resourceFromAttributes({ ...settings.resourceAttributes, [ATTR_SERVICE_NAME]: settings.serviceName }),
    sampler: new DecidedFirst(parts.sampler),
    spanProcessors: [new BoundedSpanProcessor(batches, queueMax, parts.state)]
  })
}

async function shutdownWithin (provider: TracerProvider, timeoutMs: number): Promise<void> {
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

/** A trace id given beforehand is taken once. */
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
 * With `followCaller` (the engine, called only by gateways) plain `traceidratio` follows the caller's flag, since the
 * trace id may be one an untrusted client picked.
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
 * A client outside TRUST_PROXY has no say, by flag or by its chosen id, or it could have every request recorded and
 * exported; Envoy follows the client's flag (envoyproxy/envoy#35721), an edge should not.
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

/** Past `max` spans held, a span is dropped and counted. */
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

/** During a backoff batches are dropped at once, so a dead collector costs no encoding, connections or retries. */
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
    if (this.state.pending > 0) this.state.onDropped(this.state.pending)
    this.state.pending = 0
    await this.inner.shutdown()
  }

  async forceFlush (): Promise<void> {
    await this.inner.forceFlush?.()
  }
}
