/**
 * Counters and histograms for the request path: each series is a plain object resolved once and bumped with one
 * addition, since prom-client's own classes hash the label set on every `inc`/`observe` (docs/performance-history.md).
 * At scrape time prom-client gets the values its own metrics would give; test/observability/series.test.ts compares the
 * two texts.
 */
import type { Metric, MetricObjectWithValues, MetricValueWithName, Registry } from 'prom-client'

type Labels<L extends string> = Record<L, string>

/** What prom-client's Registry asks of a metric at scrape time. */
interface Collected {
  labels: Record<string, string | number>
  value: number
  metricName?: string
}

abstract class Family<L extends string, S> {
  readonly #series = new Map<string, { labels: Labels<L>; series: S }>()
  readonly aggregator = 'sum'
  abstract readonly type: 'counter' | 'histogram'

  constructor (
    readonly name: string,
    readonly help: string,
    readonly labelNames: readonly L[],
    registry: Registry
  ) {
    // prom-client registers any object with a name and get(); its typings list only its own classes.
    registry.registerMetric(this as unknown as Metric)
  }

  /** This label set's series, made on first use: resolve it once and keep it. */
  series (labels: Labels<L>): S {
    const key = this.labelNames.map((name) => labels[name]).join('\u0000')
    let entry = this.#series.get(key)
    if (entry === undefined) this.#series.set(key, (entry = { labels: { ...labels }, series: this.create() }))
    return entry.series
  }

  /** Forget every series whose labels include these; a caller that kept one counts into nothing. */
  remove (labels: Partial<Labels<L>>): void {
    const given = Object.entries(labels) as Array<[L, string]>
    for (const [key, entry] of this.#series) {
      if (given.every(([name, value]) => entry.labels[name] === value)) this.#series.delete(key)
    }
  }

  protected abstract create (): S
  /** Written from its first count on, as prom-client's bound children are. */
  protected abstract used (series: S): boolean
  protected abstract values (labels: Labels<L>, series: S): Collected[]

  async get (): Promise<MetricObjectWithValues<MetricValueWithName<string>>> {
    const values: Collected[] = []
    for (const { labels, series } of this.#series.values()) {
      if (this.used(series)) values.push(...this.values(labels, series))
    }
    return {
      name: this.name,
      help: this.help,
      type: this.type,
      aggregator: this.aggregator,
      values
    } as unknown as MetricObjectWithValues<MetricValueWithName<string>>
  }

  reset (): void {
    this.#series.clear()
  }
}

export class CounterSeries {
  value = 0
  inc (): void {
    this.value++
  }
}

export class CounterFamily<L extends string> extends Family<L, CounterSeries> {
  readonly type = 'counter'
  protected create (): CounterSeries {
    return new CounterSeries()
  }

  protected used (series: CounterSeries): boolean {
    return series.value > 0
  }

  protected values (labels: Labels<L>, series: CounterSeries): Collected[] {
    return [{ labels, value: series.value }]
  }
}

export class HistogramSeries {
  /** Per bucket, not cumulative: observe() adds to one entry. The last is +Inf. */
  readonly counts: Float64Array
  sum = 0
  count = 0
  constructor (readonly bounds: readonly number[]) {
    this.counts = new Float64Array(bounds.length + 1)
  }

  observe (value: number): void {
    // prom-client throws on these; here a NaN would poison the sum for good.
    if (!Number.isFinite(value)) return
    const { bounds } = this
    let i = 0
    while (i < bounds.length && value > bounds[i]!) i++
    this.counts[i]!++
    this.sum += value
    this.count++
  }
}

export class HistogramFamily<L extends string> extends Family<L, HistogramSeries> {
  readonly type = 'histogram'
  constructor (
    name: string,
    help: string,
    labelNames: readonly L[],
    readonly buckets: readonly number[],
    registry: Registry
  ) {
    super(name, help, labelNames, registry)
  }

  protected create (): HistogramSeries {
    return new HistogramSeries(this.buckets)
  }

  protected used (series: HistogramSeries): boolean {
    return series.count > 0
  }

  protected values (labels: Labels<L>, series: HistogramSeries): Collected[] {
    const values: Collected[] = []
    let cumulative = 0
    this.buckets.forEach((le, i) => {
      cumulative += series.counts[i]!
      values.push({ labels: { le, ...labels }, value: cumulative, metricName: `${this.name}_bucket` })
    })
    values.push(
      { labels: { le: '+Inf', ...labels }, value: series.count, metricName: `${this.name}_bucket` },
      { labels, value: series.sum, metricName: `${this.name}_sum` },
      { labels, value: series.count, metricName: `${this.name}_count` }
    )
    return values
  }
}
