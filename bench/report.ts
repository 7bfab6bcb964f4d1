/**
 * Summaries, the table and the ratios. Figures are the median over rounds, so
 * one round disturbed by a noisy neighbour does not decide the result; failures
 * (non-2xx, errors) are summed, because any of them is worth a look.
 */

/** Cores busy during a round (CPU seconds / wall seconds); NaN where unknown. */
export interface CpuUse {
  server: number
  mock: number
  loadgen: number
  /**
   * CPU microseconds the server (gateway, nginx, or the mock for `direct`)
   * spends per request. Unlike req/s it barely moves when a neighbour takes
   * CPU away, so it is the figure to compare across noisy runs.
   */
  serverUsPerRequest: number
  /** Share of the server's CPU time spent in the kernel (system time): sockets, mostly. */
  serverSystemShare: number
}

export interface Round {
  rps: number
  p50: number
  p99: number
  non2xx: number
  errors: number
  timeouts: number
  statusCodes: Record<string, number>
  cpu: CpuUse
}

export interface Probe {
  status: number
  /** The start of the body, to explain a non-2xx at a glance. */
  body: string
}

export interface ScenarioSummary {
  description: string
  url: string | null
  connections: number
  rps: number | null
  p50: number | null
  p99: number | null
  non2xx: number | null
  errors: number | null
  statusCodes: Record<string, number>
  cpu: CpuUse | null
  probe: Probe | null
  rounds: Round[]
  /** Why the scenario did not run; absent when it ran. */
  skipped?: string
}

export interface Ratio {
  value: number | null
  goal: string
  /** null when the value is missing or the goal is informational. */
  met: boolean | null
}

export function median (values: number[]): number {
  const sorted = values.filter((v) => !Number.isNaN(v)).sort((a, b) => a - b)
  if (sorted.length === 0) return Number.NaN
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

export function summarize (description: string, url: string, connections: number, rounds: Round[], probe: Probe | null): ScenarioSummary {
  const statusCodes: Record<string, number> = {}
  for (const round of rounds) {
    for (const [code, count] of Object.entries(round.statusCodes)) statusCodes[code] = (statusCodes[code] ?? 0) + count
  }
  const cpu = (key: keyof CpuUse): number => median(rounds.map((r) => r.cpu[key]))
  return {
    description,
    url,
    connections,
    rps: median(rounds.map((r) => r.rps)),
    p50: median(rounds.map((r) => r.p50)),
    p99: median(rounds.map((r) => r.p99)),
    non2xx: rounds.reduce((n, r) => n + r.non2xx, 0),
    errors: rounds.reduce((n, r) => n + r.errors, 0),
    statusCodes,
    cpu: { server: cpu('server'), mock: cpu('mock'), loadgen: cpu('loadgen'), serverUsPerRequest: cpu('serverUsPerRequest'), serverSystemShare: cpu('serverSystemShare') },
    probe,
    rounds
  }
}

export function skippedSummary (description: string, connections: number, reason: string): ScenarioSummary {
  return {
    description, url: null, connections, rps: null, p50: null, p99: null, non2xx: null, errors: null,
    statusCodes: {}, cpu: null, probe: null, rounds: [], skipped: reason
  }
}

function ratio (a: number | null | undefined, b: number | null | undefined): number | null {
  if (a == null || b == null || Number.isNaN(a) || Number.isNaN(b) || b === 0) return null
  return Math.round((a / b) * 1000) / 1000
}

/** The ratios the goals are stated in. Each compares figures from the same run. */
export function ratios (s: Record<string, ScenarioSummary>): Record<string, Ratio> {
  const atLeast = (value: number | null, min: number): Ratio => ({ value, goal: `>= ${min}`, met: value === null ? null : value >= min })
  const p99 = ratio(s.ping?.p99, s.nginx?.p99)
  return {
    gatewayPingVsNginx: atLeast(ratio(s.ping?.rps, s.nginx?.rps), 0.8),
    gatewayPingP99VsNginx: { value: p99, goal: '<= 1', met: p99 === null ? null : p99 <= 1 },
    gatewayPingVsDirect: { value: ratio(s.ping?.rps, s.direct?.rps), goal: 'informational', met: null },
    updateVsPing: atLeast(ratio(s.update?.rps, s.ping?.rps), 0.7),
    loggingVsNginx: atLeast(ratio(s['ping-logging']?.rps, s.nginx?.rps), 0.6)
  }
}

const fixed = (v: number | null, digits: number): string => v === null || Number.isNaN(v) ? '-' : v.toFixed(digits)

const percent = (v: number | null): string => v === null || Number.isNaN(v) ? '-' : `${Math.round(v * 100)}%`

function cpuCell (cpu: CpuUse | null): string {
  if (cpu === null) return '-'
  return [cpu.server, cpu.mock, cpu.loadgen].map((v) => fixed(v, 2)).join('/')
}

export function formatTable (s: Record<string, ScenarioSummary>): string {
  const header = ['scenario', 'conns', 'req/s', 'p50 ms', 'p99 ms', 'non-2xx', 'errors', 'cpu srv/mock/load', 'srv us/req', 'sys', 'what']
  const rows = Object.entries(s).map(([name, r]) => r.skipped !== undefined
    ? [name, String(r.connections), '-', '-', '-', '-', '-', '-', '-', '-', `skipped: ${r.skipped}`]
    : [name, String(r.connections), fixed(r.rps, 0), fixed(r.p50, 2), fixed(r.p99, 2), String(r.non2xx), String(r.errors),
        cpuCell(r.cpu), fixed(r.cpu?.serverUsPerRequest ?? null, 0), percent(r.cpu?.serverSystemShare ?? null), r.description])
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => (i === header.length - 1 ? 0 : row[i]!.length))))
  const line = (cells: string[]): string => cells.map((c, i) => (i === cells.length - 1 ? c : i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ')
  return [line(header), ...rows.map(line)].join('\n')
}

export function formatRatios (r: Record<string, Ratio>): string {
  return Object.entries(r).map(([name, { value, goal, met }]) =>
    `${name.padEnd(22)} ${fixed(value, 2).padStart(6)}  goal ${goal}${met === null ? '' : met ? '  (met)' : '  (NOT met)'}`
  ).join('\n')
}

/** Status codes other than 2xx, with the probe's body, so a failing scenario explains itself. */
export function formatProblems (s: Record<string, ScenarioSummary>): string {
  const lines: string[] = []
  for (const [name, r] of Object.entries(s)) {
    if (r.skipped !== undefined) continue
    const bad = Object.entries(r.statusCodes).filter(([code]) => !code.startsWith('2'))
    if (bad.length === 0 && r.errors === 0) continue
    const codes = bad.map(([code, count]) => `${count} x ${code}`).join(', ')
    const probe = r.probe === null ? '' : `; one answer: ${r.probe.status} ${r.probe.body}`
    lines.push(`${name}: ${codes || 'no non-2xx'}, ${r.errors} errors${probe}`)
  }
  return lines.join('\n')
}
