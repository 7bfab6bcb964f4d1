/**
 * Sampling (DECISIONS 29): parent-based, a ratio of new traces. At ratio 0 a
 * request without a sampled parent exports nothing, in the gateway or the
 * engine; a parent with the sampled flag is followed by both when it comes
 * from a TRUST_PROXY peer, and only then.
 */
import t from 'tap'
import { request } from 'undici'
import { bearer } from './helpers/app.js'
import type { DecodedSpan } from '../bench/otlp-sink.js'
import { clientTraceparent, CLIENT, ofTrace, SERVER, tracedPair } from './helpers/tracing.js'

t.test('ratio 0: no parent or an unsampled one exports nothing; a trusted proxy\'s sampled parent is followed', async (t) => {
  const { sink, gateway } = await tracedPair(t, { OTEL_TRACES_SAMPLER_ARG: '0' }, { env: { TRUST_PROXY: '127.0.0.1' } })
  const ping = async (traceparent?: string): Promise<void> => {
    const res = await request(`${gateway.url}/api/portfolio/ping`, { headers: { ...bearer(), ...(traceparent === undefined ? {} : { traceparent }) } })
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
  t.same([...new Set(spans.map((s) => s.traceId))], [sampled.traceId], 'only the sampled parent\'s trace was exported')
  const server = spans.find((s) => s.service === 'portfolio-gateway' && s.kind === SERVER)!
  const engine = spans.find((s) => s.service === 'portfolio-engine')!
  t.match(server, { kind: SERVER, parentSpanId: sampled.parentId })
  t.equal(engine.traceId, sampled.traceId, 'the engine followed the sampled flag the gateway passed on')
  t.equal(sink.spans.length, 3, 'the gateway\'s server and try spans, the engine\'s server span')
})

t.test('always_off: even a sampled parent exports nothing from the gateway', async (t) => {
  const { sink, gateway, gatewayTracing } = await tracedPair(t, { OTEL_TRACES_SAMPLER: 'always_off' })
  const sampled = clientTraceparent(true)
  const res = await request(`${gateway.url}/api/portfolio/ping`, { headers: { ...bearer(), traceparent: sampled.header } })
  t.equal(res.statusCode, 200)
  await res.body.dump()
  t.equal(gatewayTracing.pending, 0, 'no span waits for export')
  await gatewayTracing.shutdown(1_000)
  t.same(sink.spans.filter((s) => s.service === 'portfolio-gateway'), [])
})

t.test('ratio 0: a sampled flag from a peer outside TRUST_PROXY is not followed; the trace id is kept', async (t) => {
  const requests = async (gateway: { url: string }): Promise<Array<{ header: string, traceId: string }>> => {
    const sent = []
    for (let i = 0; i < 50; i++) {
      const tp = clientTraceparent(true)
      sent.push(tp)
      const res = await request(`${gateway.url}/api/portfolio/ping`, { headers: { ...bearer(), traceparent: tp.header } })
      t.equal(res.statusCode, 200)
      await res.body.dump()
    }
    return sent
  }

  // TRUST_PROXY names other addresses than the test's loopback peer.
  const untrusted = await tracedPair(t, { OTEL_TRACES_SAMPLER_ARG: '0' }, { env: { TRUST_PROXY: '10.0.0.0/8,127.0.0.2' } })
  const sent = await requests(untrusted.gateway)
  // Shutting down flushes whatever the gateway held.
  await untrusted.gatewayTracing.shutdown(2_000)
  t.same(untrusted.sink.spans.filter((s) => s.service === 'portfolio-gateway'), [], 'no gateway span')
  t.equal(untrusted.gatewayTracing.pending, 0)

  const trusted = await tracedPair(t, { OTEL_TRACES_SAMPLER_ARG: '0' }, { env: { TRUST_PROXY: '127.0.0.1' } })
  const followed = await requests(trusted.gateway)
  const gatewayServer = (all: typeof trusted.sink.spans): typeof all => all.filter((s) => s.service === 'portfolio-gateway' && s.kind === SERVER)
  const spans = await trusted.sink.until((all) => gatewayServer(all).length === 50)
  t.same(new Set(gatewayServer(spans).map((s) => s.traceId)), new Set(followed.map((s) => s.traceId)), 'each trusted request exported its server span in the client\'s trace')
  // The engine's spans leave 20 ms after they end: by now, after 50 more requests and their export, any would have arrived.
  t.same(untrusted.sink.spans.filter((s) => s.service === 'portfolio-engine'), [], 'the engine was told not sampled')
  t.equal(sent.length, 50)
})

t.test('an untrusted client\'s sampled parent: the gateway draws once per request, so the share recorded is the ratio (not its square), and every recorded request has its try span', async (t) => {
  const ratio = 0.5
  const { sink, gateway } = await tracedPair(t, { OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: String(ratio) })
  const n = 400
  const traces: string[] = []
  for (let i = 0; i < n; i++) {
    const parent = clientTraceparent(true)
    traces.push(parent.traceId)
    const res = await request(`${gateway.url}/api/portfolio/ping`, { headers: { ...bearer(), traceparent: parent.header } })
    t.equal(res.statusCode, 200)
    await res.body.dump()
  }
  // Each recorded ping ends with its server span; the last one's is in once the sink holds every span ended so far.
  const servers = (): DecodedSpan[] => sink.spans.filter((s) => s.service === 'portfolio-gateway' && s.kind === SERVER)
  await sink.until(() => servers().length > 0 && servers().every((s) => sink.spans.some((c) => c.service === 'portfolio-gateway' && c.kind === CLIENT && c.parentSpanId === s.spanId)))
  const share = servers().length / n
  // Drawn twice (server, then again), the share would be the ratio squared, 0.25; 0.1 is four standard deviations.
  t.ok(Math.abs(share - ratio) <= 0.1, `recorded ${servers().length} of ${n} (${share.toFixed(2)}, ratio ${ratio})`)
  t.ok(servers().every((s) => traces.includes(s.traceId)), 'the client\'s trace ids are kept')
  const withTry = servers().filter((s) => sink.spans.some((c) => c.service === 'portfolio-gateway' && c.kind === CLIENT && c.parentSpanId === s.spanId))
  t.equal(withTry.length, servers().length, 'every recorded ping has its try span (children follow the request\'s decision)')
})
