/**
 * Sampling (DECISIONS 29): parent-based, a ratio of new traces. At ratio 0 a
 * request without a sampled parent exports nothing, in the gateway or the
 * engine; a parent with the sampled flag is followed by both.
 */
import t from 'tap'
import { request } from 'undici'
import { bearer } from './helpers/app.js'
import { clientTraceparent, ofTrace, SERVER, tracedPair } from './helpers/tracing.js'

t.test('ratio 0: no parent or an unsampled one exports nothing; a sampled parent is followed', async (t) => {
  const { sink, gateway } = await tracedPair(t, { OTEL_TRACES_SAMPLER_ARG: '0' })
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
  const spans = await sink.until((all) => ofTrace(all, sampled.traceId).length === 2)
  t.same([...new Set(spans.map((s) => s.traceId))], [sampled.traceId], 'only the sampled parent\'s trace was exported')
  const server = spans.find((s) => s.service === 'portfolio-gateway')!
  const engine = spans.find((s) => s.service === 'portfolio-engine')!
  t.match(server, { kind: SERVER, parentSpanId: sampled.parentId })
  t.equal(engine.traceId, sampled.traceId, 'the engine followed the sampled flag the gateway passed on')
  t.equal(sink.spans.length, 2)
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
