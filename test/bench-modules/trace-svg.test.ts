/**
 * The trace picture (bench/trace-svg.ts): each span a row under its parent,
 * in start order, its bar where and as long as the span ran.
 */
import t from 'tap'
import { renderWaterfall } from '../../bench/trace-svg.js'
import type { DecodedSpan } from '../../bench/otlp-sink.js'

const span = (
  spanId: string,
  parentSpanId: string,
  name: string,
  service: string,
  startMs: number,
  endMs: number,
  kind = 2
): DecodedSpan => ({
  service,
  traceId: 'ab'.repeat(16),
  spanId,
  parentSpanId,
  name,
  kind,
  startNs: BigInt(startMs * 1e6),
  endNs: BigInt(endMs * 1e6),
  attributes: {},
  statusCode: 0,
  flags: 1
})

t.test('rows in tree order, bars on one time axis', async (t) => {
  const svg = renderWaterfall(
    [
      span('03', '02', 'GET /api/portfolio/ping', 'portfolio-engine', 4, 8),
      span('01', 'ffffffffffffffff', 'GET /api/portfolio/ping', 'portfolio-gateway', 0, 10),
      span('04', '01', 'GET /api/portfolio/ping', 'portfolio-gateway', 3, 9, 3),
      span('02', '01', 'GET /api/portfolio/ping', 'portfolio-gateway', 1, 2, 3)
    ],
    'a ping'
  )
  const rows = [
    ...svg.matchAll(
      /<text x="(\d+)" y="[\d.]+"><tspan[^>]*>([a-z]+)<\/tspan> [^<]+<tspan fill="#888">([a-z]+)<\/tspan>/g
    )
  ].map(([, x, service, kind]) => `${x} ${service} ${kind}`)
  // The root (its parent is the client's, not exported), then its children by start, the engine under the try it came
  // through.
  t.same(rows, ['16 gateway server', '32 gateway client', '48 engine server', '32 gateway client'])
  const bars = [...svg.matchAll(/<rect x="([\d.]+)" y="[\d.]+" width="([\d.]+)"/g)].map(([, x, w]) => [
    Number(x),
    Number(w)
  ])
  t.equal(bars[0]![0], 430, 'the root starts at the axis origin')
  t.equal(bars[0]![1], 580, 'and spans the whole axis')
  t.equal(bars[1]![0], 430 + 58, 'a span 1 ms in starts a tenth along')
  t.match(svg, /trace abababab[ab]+ · 4 spans · 10\.00 ms/)
})
