/**
 * `npm run bench -- --chart FILE.svg`: the run as a picture, in plain SVG (no
 * charting dependency for three simple plots). Left: each scenario's req/s
 * relative to the bare gateway doing the same request (ping, update or
 * create), with the 5% feature budget marked. Right: the open-loop run past
 * saturation, p99 of accepted requests and goodput against the offered rate.
 */
import type { CostReport } from './costs.js'
import type { SaturationPoint, ScenarioSummary } from './report.js'

export interface ChartInput {
  title: string
  scenarios: Record<string, ScenarioSummary>
  saturation: { scenario: string; capacityRps: number; points: SaturationPoint[] } | null
}

/** The bare-gateway scenario each one is compared with. */
function baselineOf (name: string): string {
  if (name.includes('update')) return 'update'
  if (name.includes('create')) return name.includes('10mib') ? 'create-10mib' : 'create'
  return 'ping'
}

const escape = (text: string): string => text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;')
const num = (v: number): string => (Math.round(v * 10) / 10).toString()

function text (x: number, y: number, content: string, attrs = ''): string {
  return `<text x="${num(x)}" y="${num(y)}" ${attrs}>${escape(content)}</text>`
}

const BAR_H = 18
const WIDTH = 1100

function ratioBars (
  scenarios: Record<string, ScenarioSummary>,
  x0: number,
  y0: number,
  width: number
): { svg: string; height: number } {
  const rows = Object.entries(scenarios)
    .filter(
      ([name, s]) => s.skipped === undefined && s.rps !== null && name !== baselineOf(name) && name !== 'create-10mib'
    )
    .map(([name, s]) => ({
      name,
      base: baselineOf(name),
      value: s.rps! / (scenarios[baselineOf(name)]?.rps ?? Number.NaN)
    }))
    .filter((r) => Number.isFinite(r.value))
  const labelW = 220
  const plotW = width - labelW - 60
  const max = Math.max(1.5, ...rows.map((r) => r.value))
  const scale = (v: number): number => x0 + labelW + (v / max) * plotW
  const parts: string[] = [
    text(x0, y0, 'req/s relative to the bare gateway doing the same request', 'font-weight="bold"')
  ]
  const top = y0 + 14
  rows.forEach((r, i) => {
    const y = top + i * (BAR_H + 6)
    const feature = r.name.startsWith('ping-') || r.name === 'update-idempotent'
    const colour =
      r.name === 'nginx' || r.name === 'direct'
        ? '#888'
        : r.name.startsWith('prod')
          ? '#c0504d'
          : feature && r.value < 0.95
            ? '#e8a33d'
            : '#4f81bd'
    parts.push(text(x0, y + BAR_H - 5, `${r.name} / ${r.base}`, 'font-size="12"'))
    parts.push(
      `<rect x="${num(scale(0))}" y="${num(y)}" width="${num(scale(r.value) - scale(0))}" height="${BAR_H}" fill="${colour}"/>`
    )
    parts.push(text(scale(r.value) + 4, y + BAR_H - 5, r.value.toFixed(2), 'font-size="12"'))
  })
  const bottom = top + rows.length * (BAR_H + 6)
  for (const [v, label] of [
    [1, '1.0 = bare gateway'],
    [0.95, '0.95: feature budget'],
    [0.6, '']
  ] as const) {
    if (label === '') continue
    parts.push(
      `<line x1="${num(scale(v))}" y1="${num(top - 4)}" x2="${num(scale(v))}" y2="${num(bottom)}" stroke="#333" stroke-dasharray="${v === 1 ? '0' : '4 3'}" stroke-width="1"/>`
    )
    parts.push(
      text(
        scale(v) + (v === 1 ? 3 : -3),
        bottom + 14,
        label,
        `font-size="11" text-anchor="${v === 1 ? 'start' : 'end'}"`
      )
    )
  }
  parts.push(
    text(
      x0,
      bottom + 30,
      'grey: baselines (nginx, direct) against the gateway ping; red: everything on; amber: a feature over its 5% budget',
      'font-size="11" fill="#555"'
    )
  )
  return { svg: parts.join('\n'), height: bottom + 40 - y0 }
}

function linePlot (
  points: Array<[number, number]>,
  opts: {
    x0: number
    y0: number
    w: number
    h: number
    yMax: number
    title: string
    yLabel: string
    colour: string
    format: (v: number) => string
  }
): string {
  const { x0, y0, w, h, yMax } = opts
  const sx = (m: number): number => x0 + 40 + ((m - 0.5) / 1.5) * (w - 60)
  const sy = (v: number): number => y0 + h - (v / yMax) * (h - 30)
  const parts = [
    text(x0, y0 + 12, opts.title, 'font-weight="bold"'),
    `<line x1="${num(sx(0.5))}" y1="${num(sy(0))}" x2="${num(sx(2))}" y2="${num(sy(0))}" stroke="#333"/>`,
    text(x0, y0 + 28, opts.yLabel, 'font-size="11" fill="#555"')
  ]
  for (const m of [0.5, 1, 1.5, 2]) parts.push(text(sx(m), sy(0) + 14, `${m}x`, 'font-size="11" text-anchor="middle"'))
  const finite = points.filter(([, v]) => Number.isFinite(v))
  parts.push(
    `<polyline fill="none" stroke="${opts.colour}" stroke-width="2" points="${finite.map(([m, v]) => `${num(sx(m))},${num(sy(v))}`).join(' ')}"/>`
  )
  for (const [m, v] of finite) {
    parts.push(`<circle cx="${num(sx(m))}" cy="${num(sy(v))}" r="3" fill="${opts.colour}"/>`)
    parts.push(text(sx(m), sy(v) - 6, opts.format(v), 'font-size="11" text-anchor="middle"'))
  }
  return parts.join('\n')
}

export function renderChart (input: ChartInput): string {
  const bars = ratioBars(input.scenarios, 20, 50, 620)
  const parts = [text(20, 24, input.title, 'font-size="15" font-weight="bold"'), bars.svg]
  let height = bars.height + 60
  if (input.saturation !== null && input.saturation.points.length > 0) {
    const s = input.saturation
    const p99 = s.points.map((p): [number, number] => [p.multiple, p.p99Accepted])
    const goodput = s.points.map((p): [number, number] => [p.multiple, p.goodputRps / s.capacityRps])
    const shed = s.points.map((p): [number, number] => [p.multiple, p.shedShare + p.limitedShare])
    const x0 = 680
    parts.push(
      text(x0, 50, `past saturation: ${s.scenario}, open loop, capacity ${s.capacityRps} req/s`, 'font-weight="bold"')
    )
    parts.push(
      linePlot(p99, {
        x0,
        y0: 60,
        w: 400,
        h: 170,
        yMax: Math.max(1, ...p99.map(([, v]) => v).filter(Number.isFinite)) * 1.2,
        title: 'p99 of accepted (2xx) answers',
        yLabel: 'ms, by offered rate / capacity',
        colour: '#c0504d',
        format: (v) => v.toFixed(1)
      })
    )
    parts.push(
      linePlot(goodput, {
        x0,
        y0: 250,
        w: 400,
        h: 150,
        yMax: 2.2,
        title: 'goodput / capacity (dashed: refused share, 503 + 429)',
        yLabel: '',
        colour: '#4f81bd',
        format: (v) => v.toFixed(2)
      })
    )
    parts.push(
      linePlot(shed, {
        x0,
        y0: 250,
        w: 400,
        h: 150,
        yMax: 2.2,
        title: '',
        yLabel: '',
        colour: '#999',
        format: (v) => (v > 0 ? `${(v * 100).toFixed(0)}%` : '')
      }).replace('stroke-width="2"', 'stroke-width="1.5" stroke-dasharray="4 3"')
    )
    height = Math.max(height, 430)
  }
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${num(height)}" viewBox="0 0 ${WIDTH} ${num(height)}" font-family="sans-serif" font-size="13">
<rect width="100%" height="100%" fill="#fff"/>
${parts.join('\n')}
</svg>
`
}

/**
 * `--cost-chart FILE.svg`: the cost table as bars, each row's CPU per request
 * as a ratio to the bare proxy, with the targets marked (1.10 the bare
 * gateway, 1.30 everything on) and each feature's own share written beside
 * its bar.
 */
export function renderCostChart (title: string, costs: CostReport): string {
  const rows = costs.rows.filter((r) => r.ratio !== null)
  const x0 = 20
  const labelW = 430
  const plotW = WIDTH - labelW - 140
  const max = Math.max(1.6, ...rows.map((r) => r.ratio!))
  const scale = (v: number): number => x0 + labelW + (v / max) * plotW
  const top = 64
  const parts: string[] = [
    text(x0, 24, title, 'font-size="15" font-weight="bold"'),
    text(
      x0,
      46,
      `server CPU per request as a ratio to the bare Node proxy (${costs.baseline}); median of interleaved rounds`,
      'font-weight="bold"'
    )
  ]
  rows.forEach((r, i) => {
    const y = top + i * (BAR_H + 6)
    const colour =
      r.scenario === costs.baseline ? '#888' : r.met === false ? '#e8a33d' : r.adds === null ? '#c0504d' : '#4f81bd'
    parts.push(text(x0, y + BAR_H - 5, `${r.scenario}: ${r.feature}`.slice(0, 70), 'font-size="12"'))
    parts.push(
      `<rect x="${num(scale(0))}" y="${num(y)}" width="${num(scale(r.ratio!) - scale(0))}" height="${BAR_H}" fill="${colour}"/>`
    )
    const share = r.share === null ? '' : `  (own ${r.share >= 0 ? '+' : ''}${(r.share * 100).toFixed(1)}%)`
    parts.push(text(scale(r.ratio!) + 4, y + BAR_H - 5, `${r.ratio!.toFixed(2)}${share}`, 'font-size="12"'))
  })
  const bottom = top + rows.length * (BAR_H + 6)
  for (const [v, label] of [
    [1, '1.00 = bare proxy'],
    [1.1, '1.10'],
    [1.3, '1.30']
  ] as const) {
    parts.push(
      `<line x1="${num(scale(v))}" y1="${num(top - 4)}" x2="${num(scale(v))}" y2="${num(bottom)}" stroke="#333" stroke-dasharray="${v === 1 ? '0' : '4 3'}" stroke-width="1"/>`
    )
    parts.push(text(scale(v) + 3, bottom + 14, label, 'font-size="11"'))
  }
  parts.push(
    text(
      x0,
      bottom + 32,
      'grey: the bare proxy; red: the gateway with nothing / everything on (targets 1.10 and 1.30); blue: one feature on; amber: over its target (a feature: own share above 5%)',
      'font-size="11" fill="#555"'
    )
  )
  const height = bottom + 44
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${num(height)}" viewBox="0 0 ${WIDTH} ${num(height)}" font-family="sans-serif" font-size="13">
<rect width="100%" height="100%" fill="#fff"/>
${parts.join('\n')}
</svg>
`
}
