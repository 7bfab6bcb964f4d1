/**
 * Sampling (DECISIONS 29): parent-based, a ratio of new traces. At ratio 0 a
 * request without a sampled parent exports nothing, in the gateway or the
 * engine; a parent with the sampled flag is followed by both when it comes
 * from a TRUST_PROXY peer, and only then.
 */
import t from 'tap'
import { ROOT_CONTEXT } from '@opentelemetry/api'
import { SamplingDecision, TraceIdRatioBasedSampler } from '@opentelemetry/sdk-trace'
import { request } from 'undici'
import { bearer } from '../helpers/app.js'
import type { DecodedSpan } from '../../bench/otlp-sink.js'
import { clientTraceparent, CLIENT, ofTrace, SERVER, tracedPair } from '../helpers/tracing.js'

t.test(
  "ratio 0: no parent or an unsampled one exports nothing; a trusted proxy's sampled parent is followed",
  async (t) => {
    const { sink, gateway } = await tracedPair(
      t,
      { OTEL_TRACES_SAMPLER_ARG: '0' },
      { env: { TRUST_PROXY: '127.0.0.1' } }
    )
    const ping = async (traceparent?: string): Promise<void> => {
      const res = await request(`${gateway.url}/api/portfolio/ping`, {
        headers: { ...bearer(), ...(traceparent === undefined ? {} : { traceparent }) }
      })
      t.equal(res.statusCode, 200)
      await res.body.dump()
    }
    for (let i = 0; i < 20; i++) await ping()
    const unsampled = clientTraceparent(false)
    await ping(unsampled.header)
    const sampled = clientTraceparent(true)
    await ping(sampled.header)
    // Spans leave in the order they end: once the sampled trace is in, anything of the others would be too.
    const spans = await sink.until((all) => ofTrace(all, sampled.traceId).length === 3)
    t.same([...new Set(spans.map((s) => s.traceId))], [sampled.traceId], "only the sampled parent's trace was exported")
    const server = spans.find((s) => s.service === 'portfolio-gateway' && s.kind === SERVER)!
    const engine = spans.find((s) => s.service === 'portfolio-engine')!
    t.match(server, { kind: SERVER, parentSpanId: sampled.parentId })
    t.equal(engine.traceId, sampled.traceId, 'the engine followed the sampled flag the gateway passed on')
    t.equal(sink.spans.length, 3, "the gateway's server and try spans, the engine's server span")
  }
)

t.test('always_off: even a sampled parent exports nothing from the gateway', async (t) => {
  const { sink, gateway, gatewayTracing } = await tracedPair(t, { OTEL_TRACES_SAMPLER: 'always_off' })
  const sampled = clientTraceparent(true)
  const res = await request(`${gateway.url}/api/portfolio/ping`, {
    headers: { ...bearer(), traceparent: sampled.header }
  })
  t.equal(res.statusCode, 200)
  await res.body.dump()
  t.equal(gatewayTracing.pending, 0, 'no span waits for export')
  await gatewayTracing.shutdown(1_000)
  t.same(
    sink.spans.filter((s) => s.service === 'portfolio-gateway'),
    []
  )
})

t.test('ratio 0: a sampled flag from a peer outside TRUST_PROXY is not followed; the trace id is kept', async (t) => {
  const requests = async (gateway: { url: string }): Promise<Array<{ header: string; traceId: string }>> => {
    const sent = []
    for (let i = 0; i < 50; i++) {
      const tp = clientTraceparent(true)
      sent.push(tp)
      const res = await request(`${gateway.url}/api/portfolio/ping`, {
        headers: { ...bearer(), traceparent: tp.header }
      })
      t.equal(res.statusCode, 200)
      await res.body.dump()
    }
    return sent
  }

  // TRUST_PROXY names other addresses than the test's loopback peer.
  const untrusted = await tracedPair(
    t,
    { OTEL_TRACES_SAMPLER_ARG: '0' },
    { env: { TRUST_PROXY: '10.0.0.0/8,127.0.0.2' } }
  )
  const sent = await requests(untrusted.gateway)
  // Shutting down flushes whatever the gateway held.
  await untrusted.gatewayTracing.shutdown(2_000)
  t.same(
    untrusted.sink.spans.filter((s) => s.service === 'portfolio-gateway'),
    [],
    'no gateway span'
  )
  t.equal(untrusted.gatewayTracing.pending, 0)

  const trusted = await tracedPair(t, { OTEL_TRACES_SAMPLER_ARG: '0' }, { env: { TRUST_PROXY: '127.0.0.1' } })
  const followed = await requests(trusted.gateway)
  const gatewayServer = (all: typeof trusted.sink.spans): typeof all =>
    all.filter((s) => s.service === 'portfolio-gateway' && s.kind === SERVER)
  const spans = await trusted.sink.until((all) => gatewayServer(all).length === 50)
  t.same(
    new Set(gatewayServer(spans).map((s) => s.traceId)),
    new Set(followed.map((s) => s.traceId)),
    "each trusted request exported its server span in the client's trace"
  )
  // The engine's spans leave 20 ms after they end: by now, after 50 more requests and their export, any would have
  // arrived.
  t.same(
    untrusted.sink.spans.filter((s) => s.service === 'portfolio-engine'),
    [],
    'the engine was told not sampled'
  )
  t.equal(sent.length, 50)
})

t.test(
  "an untrusted client's sampled parent: the gateway draws once per request, so the share recorded is the ratio (not its square), and every recorded request has its try span",
  async (t) => {
    const ratio = 0.5
    const { sink, gateway } = await tracedPair(t, {
      OTEL_TRACES_SAMPLER: 'traceidratio',
      OTEL_TRACES_SAMPLER_ARG: String(ratio)
    })
    const n = 400
    const traces: string[] = []
    for (let i = 0; i < n; i++) {
      const parent = clientTraceparent(true)
      traces.push(parent.traceId)
      const res = await request(`${gateway.url}/api/portfolio/ping`, {
        headers: { ...bearer(), traceparent: parent.header }
      })
      t.equal(res.statusCode, 200)
      await res.body.dump()
    }
    // Each recorded ping ends with its server span; the last one's is in once the sink holds every span ended so far.
    const servers = (): DecodedSpan[] =>
      sink.spans.filter((s) => s.service === 'portfolio-gateway' && s.kind === SERVER)
    await sink.until(
      () =>
        servers().length > 0 &&
        servers().every((s) =>
          sink.spans.some((c) => c.service === 'portfolio-gateway' && c.kind === CLIENT && c.parentSpanId === s.spanId)
        )
    )
    const share = servers().length / n
    // Drawn twice (server, then again), the share would be the ratio squared, 0.25; 0.1 is four standard deviations.
    t.ok(Math.abs(share - ratio) <= 0.1, `recorded ${servers().length} of ${n} (${share.toFixed(2)}, ratio ${ratio})`)
    t.ok(
      servers().every((s) => traces.includes(s.traceId)),
      "the client's trace ids are kept"
    )
    const withTry = servers().filter((s) =>
      sink.spans.some((c) => c.service === 'portfolio-gateway' && c.kind === CLIENT && c.parentSpanId === s.spanId)
    )
    t.equal(
      withTry.length,
      servers().length,
      "every recorded ping has its try span (children follow the request's decision)"
    )
  }
)

t.test(
  'traceidratio: a trace the gateway starts is decided on its trace id, as every service that samples on the id decides',
  async (t) => {
    const ratio = 0.5
    const { sink, gateway, gatewayTracing } = await tracedPair(t, {
      OTEL_TRACES_SAMPLER: 'traceidratio',
      OTEL_TRACES_SAMPLER_ARG: String(ratio)
    })
    const n = 200
    for (let i = 0; i < n; i++) {
      const res = await request(`${gateway.url}/api/portfolio/ping`, { headers: bearer() })
      t.equal(res.statusCode, 200)
      await res.body.dump()
    }
    await gatewayTracing.shutdown(2_000)
    const recorded = sink.spans
      .filter((s) => s.service === 'portfolio-gateway' && s.kind === SERVER)
      .map((s) => s.traceId)
    const byId = new TraceIdRatioBasedSampler(ratio)
    const refused = recorded.filter(
      (id) => byId.shouldSample(ROOT_CONTEXT, id).decision === SamplingDecision.NOT_RECORD
    )
    // A random draw instead would record about half of these against the ratio sampler's verdict on their ids.
    t.ok(recorded.length > n * 0.3 && recorded.length < n * 0.7, `recorded ${recorded.length} of ${n}`)
    t.same(refused, [], 'every recorded trace is one the ratio sampler accepts on its id')
  }
)

t.test(
  "traceidratio: the engine follows the gateway's flag, so a trace id an untrusted client picked records nothing there",
  async (t) => {
    const { sink, gateway, gatewayTracing, engineTracing } = await tracedPair(t, {
      OTEL_TRACES_SAMPLER: 'traceidratio',
      OTEL_TRACES_SAMPLER_ARG: '0.01'
    })
    // The ratio sampler accepts this id at any ratio above 0 (the XOR of its words is 1).
    const picked = '00000000000000000000000000000001'
    t.equal(
      new TraceIdRatioBasedSampler(0.01).shouldSample(ROOT_CONTEXT, picked).decision,
      SamplingDecision.RECORD_AND_SAMPLED
    )
    for (let i = 0; i < 50; i++) {
      const parent = clientTraceparent(i % 2 === 0)
      const res = await request(`${gateway.url}/api/portfolio/ping`, {
        headers: { ...bearer(), traceparent: parent.header.replace(parent.traceId, picked) }
      })
      t.equal(res.statusCode, 200)
      await res.body.dump()
    }
    await gatewayTracing.shutdown(2_000)
    await engineTracing.shutdown(2_000)
    const tries = new Set(
      sink.spans.filter((s) => s.service === 'portfolio-gateway' && s.kind === CLIENT).map((s) => s.spanId)
    )
    const engine = sink.spans.filter((s) => s.service === 'portfolio-engine')
    t.same(
      engine.filter((s) => !tries.has(s.parentSpanId)),
      [],
      'an engine span only under a try the gateway recorded'
    )
    t.ok(engine.length <= 5, `the engine recorded ${engine.length} of 50, the gateway's draws at 1%`)
  }
)

t.test(
  'a traceparent the gateway rejects (a later version over 512 characters) starts a new trace in the span too, as in the log lines',
  async (t) => {
    const { sink, gateway, gatewayTracing } = await tracedPair(
      t,
      { OTEL_TRACES_SAMPLER: 'always_on' },
      { env: { TRUST_PROXY: '127.0.0.1' } }
    )
    const parent = clientTraceparent(true)
    const header = `01-${parent.traceId}-${parent.parentId}-01-${'x'.repeat(500)}`
    const res = await request(`${gateway.url}/api/portfolio/ping`, { headers: { ...bearer(), traceparent: header } })
    t.equal(res.statusCode, 200)
    await res.body.dump()
    await gatewayTracing.shutdown(2_000)
    const server = sink.spans.find((s) => s.service === 'portfolio-gateway' && s.kind === SERVER)
    t.not(server?.traceId, parent.traceId, "not the rejected header's trace")
    t.equal(server?.parentSpanId, '', 'a root span')
  }
)
