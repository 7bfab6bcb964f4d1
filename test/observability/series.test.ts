/**
 * The request path's plain-number series (src/observability/series.ts) must
 * read, at scrape time, exactly as prom-client's own Counter and Histogram
 * would after the same observations: same lines, same order, same values.
 */
import t from 'tap'
import { Counter, Histogram, Registry } from 'prom-client'
import { LATENCY_BUCKETS_S } from '../../src/observability/metrics.js'
import { CounterFamily, HistogramFamily } from '../../src/observability/series.js'

// Values on, between and past the bounds, +Inf included.
const OBSERVED = [0, 0.001, 0.0010001, 0.003, 0.0025, 0.7, 10, 11, 1e9, 0.042]

t.test('a histogram family writes the text prom-client writes for the same observations', async (t) => {
  const ours = new Registry()
  const theirs = new Registry()
  const family = new HistogramFamily('h_seconds', 'help "text"\\n', ['route', 'method'], LATENCY_BUCKETS_S, ours)
  const reference = new Histogram({
    name: 'h_seconds',
    help: 'help "text"\\n',
    labelNames: ['route', 'method'],
    buckets: LATENCY_BUCKETS_S,
    registers: [theirs]
  })
  const a = family.series({ route: '/api/portfolio/ping', method: 'GET' })
  const b = family.series({ route: '/a"quoted\\route', method: 'POST' })
  family.series({ route: '/never', method: 'GET' })
  reference.labels({ route: '/never', method: 'GET' })
  t.equal(family.series({ route: '/api/portfolio/ping', method: 'GET' }), a, 'one series per label set')
  for (const value of OBSERVED) {
    a.observe(value)
    reference.observe({ route: '/api/portfolio/ping', method: 'GET' }, value)
  }
  b.observe(0.3)
  b.observe(Number.NaN) // prom-client would throw; a family ignores it rather than poison the sum
  b.observe(Number.POSITIVE_INFINITY)
  reference.observe({ route: '/a"quoted\\route', method: 'POST' }, 0.3)
  const text = await ours.metrics()
  t.equal(text, await theirs.metrics())
  t.match(
    text,
    'h_seconds_bucket{le="0.0025",route="/api/portfolio/ping",method="GET"} 4\n',
    'cumulative buckets, bound inclusive'
  )
  t.match(text, 'h_seconds_bucket{le="+Inf",route="/api/portfolio/ping",method="GET"} 10\n')
  const samples = async (registry: Registry) =>
    (await registry.getMetricsAsJSON()).flatMap((m) => m.values.map((v) => ({ ...v, exemplar: undefined })))
  t.same(await samples(ours), await samples(theirs), 'the JSON view has the same samples')

  ours.resetMetrics()
  t.equal(
    await ours.metrics(),
    '# HELP h_seconds help "text"\\\\n\n# TYPE h_seconds histogram\n',
    'reset forgets every series'
  )
})

t.test('a counter family writes the text prom-client writes for the same increments', async (t) => {
  const ours = new Registry()
  const theirs = new Registry()
  const family = new CounterFamily('c_total', 'requests', ['route', 'status_class'], ours)
  const reference = new Counter({
    name: 'c_total',
    help: 'requests',
    labelNames: ['route', 'status_class'],
    registers: [theirs]
  })
  const ok = family.series({ route: '/x', status_class: '2xx' })
  family.series({ route: '/x', status_class: '5xx' })
  reference.labels({ route: '/x', status_class: '5xx' })
  for (let i = 0; i < 3; i++) {
    ok.inc()
    reference.inc({ route: '/x', status_class: '2xx' })
  }
  const text = await ours.metrics()
  t.equal(text, await theirs.metrics())
  t.equal(
    text,
    '# HELP c_total requests\n# TYPE c_total counter\nc_total{route="/x",status_class="2xx"} 3\n',
    'a series resolved but never counted is not written'
  )
})

t.test('a family takes its name in the registry like any metric', async (t) => {
  const registry = new Registry()
  new CounterFamily('taken_total', 'x', [], registry)
  t.throws(() => new Counter({ name: 'taken_total', help: 'y', registers: [registry] }), {
    message: 'A metric with the name taken_total has already been registered.'
  })
})

t.test(
  'remove(labels) forgets every series with those labels, and only those (an engine endpoint that left the set)',
  async (t) => {
    const registry = new Registry()
    const calls = new CounterFamily('calls_total', 'calls', ['call', 'endpoint'], registry)
    const durations = new HistogramFamily('d_seconds', 'durations', ['endpoint'], [0.1], registry)
    for (const endpoint of ['10.0.0.1:4000', '10.0.0.2:4000']) {
      calls.series({ call: 'ping', endpoint }).inc()
      calls.series({ call: 'update', endpoint }).inc()
      durations.series({ endpoint }).observe(0.05)
    }
    calls.remove({ endpoint: '10.0.0.1:4000' })
    durations.remove({ endpoint: '10.0.0.1:4000' })
    const text = await registry.metrics()
    t.notMatch(text, '10.0.0.1:4000', 'no series of the endpoint that left')
    t.match(text, 'calls_total{call="ping",endpoint="10.0.0.2:4000"} 1\n')
    t.match(text, 'calls_total{call="update",endpoint="10.0.0.2:4000"} 1\n')
    t.match(text, 'd_seconds_count{endpoint="10.0.0.2:4000"} 1\n')
    calls.series({ call: 'ping', endpoint: '10.0.0.1:4000' }).inc()
    t.match(
      await registry.metrics(),
      'calls_total{call="ping",endpoint="10.0.0.1:4000"} 1\n',
      'an address that comes back starts from zero'
    )
  }
)
