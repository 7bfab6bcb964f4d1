/**
 * docs/trace.svg: a waterfall of one real trace. A traced gateway and a traced
 * reference engine (in this process, on loopback sockets) export over OTLP to
 * the sink (bench/otlp-sink.ts), which decodes what they sent; one keyed
 * create with an image is drawn.
 *
 *   npx tsc -p bench && node dist/bench/trace-svg.js docs/trace.svg
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createHmac, randomBytes } from 'node:crypto'
import { pathToFileURL } from 'node:url'
import { request } from 'undici'
import { compose } from '../src/compose.js'
import { loadConfig } from '../src/config.js'
import { buildEngine } from '../src/reference-engine/engine.js'
import { startTracing } from '../src/shared/tracing-sdk.js'
import { startOtlpSink, type DecodedSpan } from './otlp-sink.js'
import { createForm, pngImage } from './payloads.js'

const KIND = ['unspecified', 'internal', 'server', 'client', 'producer', 'consumer']
const COLOURS: Record<string, string> = { 'portfolio-gateway': '#3b6fb6', 'portfolio-engine': '#d9822b' }

/** One trace as an SVG waterfall: a row per span, indented under its parent, bars on a shared time axis. */
export function renderWaterfall (spans: DecodedSpan[], title: string): string {
  const byParent = new Map<string, DecodedSpan[]>()
  for (const s of spans) byParent.set(s.parentSpanId, [...(byParent.get(s.parentSpanId) ?? []), s])
  const ids = new Set(spans.map((s) => s.spanId))
  const rows: Array<{ span: DecodedSpan, depth: number }> = []
  const walk = (span: DecodedSpan, depth: number): void => {
    rows.push({ span, depth })
    const children = [...(byParent.get(span.spanId) ?? [])].sort((a, b) => Number(a.startNs - b.startNs))
    for (const child of children) walk(child, depth + 1)
  }
  const roots = spans.filter((s) => !ids.has(s.parentSpanId)).sort((a, b) => Number(a.startNs - b.startNs))
  for (const root of roots) walk(root, 0)

  const t0 = rows.reduce((m, r) => (r.span.startNs < m ? r.span.startNs : m), rows[0]!.span.startNs)
  const t1 = rows.reduce((m, r) => (r.span.endNs > m ? r.span.endNs : m), 0n)
  const totalMs = Number(t1 - t0) / 1e6
  const LABEL = 430
  const WIDTH = 1100
  const ROW = 26
  const TOP = 56
  const plot = WIDTH - LABEL - 90
  const x = (ns: bigint): number => LABEL + (Number(ns - t0) / 1e6 / totalMs) * plot
  const esc = (text: string): string => text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;')
  const height = TOP + rows.length * ROW + 50
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${height}" viewBox="0 0 ${WIDTH} ${height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">`,
    `<rect width="${WIDTH}" height="${height}" fill="#ffffff"/>`,
    `<text x="16" y="24" font-size="15" font-weight="bold">${esc(title)}</text>`,
    `<text x="16" y="42" fill="#555">trace ${spans[0]!.traceId} · ${rows.length} spans · ${totalMs.toFixed(2)} ms</text>`
  ]
  for (let i = 0; i <= 4; i++) {
    const gx = LABEL + (plot * i) / 4
    out.push(`<line x1="${gx.toFixed(1)}" y1="${TOP - 6}" x2="${gx.toFixed(1)}" y2="${height - 40}" stroke="#e3e3e3"/>`)
    out.push(`<text x="${gx.toFixed(1)}" y="${height - 24}" text-anchor="middle" fill="#777">${((totalMs * i) / 4).toFixed(1)} ms</text>`)
  }
  rows.forEach(({ span, depth }, i) => {
    const y = TOP + i * ROW
    const colour = COLOURS[span.service] ?? '#777'
    const start = x(span.startNs)
    const width = Math.max(2, x(span.endNs) - start)
    const ms = Number(span.endNs - span.startNs) / 1e6
    const detail = [span.attributes['portfolio.engine.retry_reason'] === undefined ? '' : `retry: ${String(span.attributes['portfolio.engine.retry_reason'])}`,
      span.attributes['http.response.status_code'] === undefined ? '' : String(span.attributes['http.response.status_code'])].filter((d) => d !== '').join(' · ')
    out.push(`<text x="${16 + depth * 16}" y="${y + 15}"><tspan fill="${colour}" font-weight="bold">${esc(span.service.replace('portfolio-', ''))}</tspan> ${esc(span.name)} <tspan fill="#888">${KIND[span.kind] ?? ''}</tspan></text>`)
    out.push(`<rect x="${start.toFixed(1)}" y="${y + 4}" width="${width.toFixed(1)}" height="${ROW - 10}" rx="3" fill="${colour}" fill-opacity="${span.statusCode === 2 ? 0.35 : 0.85}"${span.statusCode === 2 ? ' stroke="#c0392b"' : ''}/>`)
    out.push(`<text x="${(start + width + 6).toFixed(1)}" y="${y + 15}" fill="#333">${ms.toFixed(2)} ms${detail === '' ? '' : ` · ${esc(detail)}`}</text>`)
  })
  out.push('</svg>')
  return out.join('\n') + '\n'
}

/** Capture one keyed create with an image through a traced gateway and engine; the decoded spans of its trace. */
export async function captureCreateTrace (): Promise<DecodedSpan[]> {
  const sink = await startOtlpSink()
  const settings = { url: `${sink.url}/v1/traces`, headers: {}, resourceAttributes: {}, sampler: 'always_on' as const, ratio: 1 }
  const engineTracing = startTracing({ ...settings, serviceName: 'portfolio-engine' }, { exportDelayMs: 20 })
  const gatewayTracing = startTracing({ ...settings, serviceName: 'portfolio-gateway' }, { exportDelayMs: 20 })
  const imageDir = await mkdtemp(join(tmpdir(), 'trace-svg-'))
  const engine = await buildEngine({ imageDir, tracer: engineTracing.tracer })
  const engineUrl = await engine.listen({ port: 0, host: '127.0.0.1' })
  const secret = randomBytes(32).toString('hex')
  const config = loadConfig({ JWT_SECRET: secret, UPSTREAM_URL: engineUrl, OTEL_EXPORTER_OTLP_ENDPOINT: sink.url, OTEL_TRACES_SAMPLER: 'always_on', SHED_EVENT_LOOP_DELAY_MS: '0' })
  const gateway = await compose(config, { tracing: gatewayTracing })
  const url = await gateway.app.listen({ port: 0, host: '127.0.0.1' })
  try {
    const token = hs256(secret)
    const form = createForm(pngImage(256 * 1024))
    const res = await request(`${url}/api/portfolio/create`, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': form.contentType, 'idempotency-key': randomBytes(8).toString('hex') }, body: form.body })
    if (res.statusCode !== 200) throw new Error(`create answered ${res.statusCode}: ${await res.body.text()}`)
    await res.body.dump()
    const spans = await sink.until((all) => all.some((s) => s.service === 'portfolio-engine') && all.some((s) => s.service === 'portfolio-gateway' && s.kind === 2) && all.some((s) => s.name === 'idempotency complete'))
    const traceId = spans.find((s) => s.kind === 2 && s.service === 'portfolio-gateway')!.traceId
    return spans.filter((s) => s.traceId === traceId)
  } finally {
    await gateway.close()
    await engine.close()
    await Promise.all([gatewayTracing.shutdown(1_000), engineTracing.shutdown(1_000)])
    await sink.close()
    await rm(imageDir, { recursive: true, force: true })
  }
}

function hs256 (secret: string): string {
  const b64 = (v: unknown): string => Buffer.from(JSON.stringify(v)).toString('base64url')
  const input = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64({ sub: 'trace-picture', exp: Math.floor(Date.now() / 1000) + 300 })}`
  return `${input}.${createHmac('sha256', secret).update(input).digest('base64url')}`
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const out = process.argv[2] ?? 'docs/trace.svg'
  const spans = await captureCreateTrace()
  await writeFile(out, renderWaterfall(spans, 'POST /api/portfolio/create with Idempotency-Key and a 256 KiB image'))
  process.stdout.write(`${out}: ${spans.length} spans\n`)
}
