/**
 * Summaries, the table and the ratios. Figures are the median over rounds, so
 * one round disturbed by a noisy neighbour does not decide the result; failures
 * (non-2xx, errors) are summed, because any of them is worth a look.
 */
import { cpus, loadavg } from 'node:os'

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
  /** The same comparison in server CPU microseconds per request (lower is cheaper), where it applies. */
  cpu?: number | null
}

/** One offered rate of the open-loop run. */
export interface SaturationPoint {
  /** Offered rate / measured capacity. */
  multiple: number
  offeredRps: number
  /** Answers of any status per second. */
  answeredRps: number
  /** 2xx answers per second. */
  goodputRps: number
  p50Accepted: number
  p99Accepted: number
  /** Shares of all answers: 503 (shed) and 429 (rate limited). */
  shedShare: number
  limitedShare: number
  otherNon2xx: number
  /** Connection errors and answers slower than 10 s. */
  errors: number
  /** Due but not sent: the generator's own queue (50,000) was full. */
  notSent: number
  statusCodes: Record<string, number>
}

/** The q-quantile (0..1) of sorted values, nearest rank, rounded to 0.01 ms. */
export function quantile (sorted: Float64Array, q: number): number {
  if (sorted.length === 0) return Number.NaN
  const value = sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)] ?? Number.NaN
  return Math.round(value * 100) / 100
}

/** The overload goal: at 2x capacity, the p99 of accepted requests stays within 3x the p99 at 0.5x. */
export function saturationVerdict (points: SaturationPoint[]): Ratio {
  const low = points.find((p) => p.multiple === 0.5)?.p99Accepted
  const high = points.find((p) => p.multiple === 2)?.p99Accepted
  const value = ratio(high, low)
  return { value, goal: '<= 3 (p99 accepted at 2x / at 0.5x)', met: value === null ? null : value <= 3 }
}

export function formatSaturation (
  scenario: string,
  capacity: number,
  connections: number,
  points: SaturationPoint[],
  verdict: Ratio
): string {
  const header = [
    'offered',
    'req/s',
    'answered/s',
    'goodput/s',
    'p50 ok ms',
    'p99 ok ms',
    'shed 503',
    'limited 429',
    'other',
    'errors+unsent'
  ]
  const rows = points.map((p) => [
    `${p.multiple}x`,
    String(p.offeredRps),
    String(p.answeredRps),
    String(p.goodputRps),
    fixed(p.p50Accepted, 2),
    fixed(p.p99Accepted, 2),
    percent1(p.shedShare),
    percent1(p.limitedShare),
    String(p.otherNon2xx),
    String(p.errors + p.notSent)
  ])
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i]!.length)))
  const line = (cells: string[]): string =>
    cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ')
  return [
    `saturation: open loop (paced, latency from when each request was due) on ${scenario}, capacity ${capacity} req/s (best closed-loop round), up to ${connections} connections`,
    line(header),
    ...rows.map(line),
    `p99 accepted at 2x / 0.5x ${fixed(verdict.value, 2)}  goal ${verdict.goal}${verdict.met === null ? '' : verdict.met ? '  (met)' : '  (NOT met)'}`
  ].join('\n')
}

export function median (values: number[]): number {
  const sorted = values.filter((v) => !Number.isNaN(v)).sort((a, b) => a - b)
  if (sorted.length === 0) return Number.NaN
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

/**
 * One round's figure for a scenario measured more than once in it (a cost
 * row's base, bench/schedule.ts), so every scenario has one Round per round:
 * counts summed; CPU per request weighted by each measurement's requests
 * (the measurements last equally long, so by req/s); rates, busy cores and
 * latency quantiles the mean of the measurements'.
 */
export function mergeRounds (measured: readonly Round[]): Round {
  if (measured.length === 1) return measured[0]!
  const mean = (values: number[]): number => values.reduce((sum, v) => sum + v, 0) / values.length
  const requests = measured.reduce((sum, r) => sum + r.rps, 0)
  const statusCodes: Record<string, number> = {}
  for (const r of measured) {
    for (const [code, count] of Object.entries(r.statusCodes)) statusCodes[code] = (statusCodes[code] ?? 0) + count
  }
  const cpu = (key: keyof CpuUse): number => mean(measured.map((r) => r.cpu[key]))
  return {
    rps: Math.round(mean(measured.map((r) => r.rps))),
    p50: Math.round(mean(measured.map((r) => r.p50)) * 100) / 100,
    p99: Math.round(mean(measured.map((r) => r.p99)) * 100) / 100,
    non2xx: measured.reduce((n, r) => n + r.non2xx, 0),
    errors: measured.reduce((n, r) => n + r.errors, 0),
    timeouts: measured.reduce((n, r) => n + r.timeouts, 0),
    statusCodes,
    cpu: {
      server: Math.round(cpu('server') * 100) / 100,
      mock: Math.round(cpu('mock') * 100) / 100,
      loadgen: Math.round(cpu('loadgen') * 100) / 100,
      serverUsPerRequest:
        requests === 0
          ? Number.NaN
          : Math.round(measured.reduce((sum, r) => sum + r.cpu.serverUsPerRequest * r.rps, 0) / requests),
      serverSystemShare: Math.round(cpu('serverSystemShare') * 100) / 100
    }
  }
}

export function summarize (
  description: string,
  url: string,
  connections: number,
  rounds: Round[],
  probe: Probe | null
): ScenarioSummary {
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
    cpu: {
      server: cpu('server'),
      mock: cpu('mock'),
      loadgen: cpu('loadgen'),
      serverUsPerRequest: cpu('serverUsPerRequest'),
      serverSystemShare: cpu('serverSystemShare')
    },
    probe,
    rounds
  }
}

export function skippedSummary (description: string, connections: number, reason: string): ScenarioSummary {
  return {
    description,
    url: null,
    connections,
    rps: null,
    p50: null,
    p99: null,
    non2xx: null,
    errors: null,
    statusCodes: {},
    cpu: null,
    probe: null,
    rounds: [],
    skipped: reason
  }
}

function ratio (a: number | null | undefined, b: number | null | undefined): number | null {
  if (a == null || b == null || Number.isNaN(a) || Number.isNaN(b) || b === 0) return null
  return Math.round((a / b) * 1000) / 1000
}

/**
 * The ratios the issues' goals are stated in, req/s of one scenario over
 * another. Each compares figures from the same run. A feature "costing at
 * most 5%" means its req/s is at least 0.95 of the same request on the bare
 * gateway; `cpu` gives the same comparison in CPU time per request.
 */
export function ratios (s: Record<string, ScenarioSummary>): Record<string, Ratio> {
  const cpuOf = (name: string): number | null | undefined => s[name]?.cpu?.serverUsPerRequest
  const compare = (a: string, b: string, min: number | null): Ratio => {
    const value = ratio(s[a]?.rps, s[b]?.rps)
    return {
      value,
      goal: min === null ? 'informational' : `>= ${min}`,
      met: min === null || value === null ? null : value >= min,
      cpu: ratio(cpuOf(a), cpuOf(b))
    }
  }
  const p99 = ratio(s.ping?.p99, s.nginx?.p99)
  return {
    gatewayPingVsNginx: compare('ping', 'nginx', 0.8),
    gatewayPingP99VsNginx: { value: p99, goal: '<= 1', met: p99 === null ? null : p99 <= 1 },
    gatewayPingVsDirect: compare('ping', 'direct', null),
    updateVsPing: compare('update', 'ping', 0.7),
    loggingVsNginx: compare('ping-logging', 'nginx', 0.6),
    loggingVsPing: compare('ping-logging', 'ping', null),
    // Key-set ping within 5% of HS256 ping.
    keySetVsHs256Ping: compare('ping-jwks', 'ping', 0.95),
    // In-process limit at most 5%, Redis at most 20%; idempotency: 5% per feature.
    rateLimitVsPing: compare('ping-ratelimit', 'ping', 0.95),
    redisLimitVsPing: compare('ping-redis', 'ping', 0.8),
    redisLimitUsersVsPing: compare('ping-redis-users', 'ping', 0.8),
    // The cluster costs what one Redis does, or says how much more.
    redisClusterLimitVsPing: compare('ping-redis-cluster', 'ping', null),
    idempotentVsUpdate: compare('update-idempotent', 'update', 0.95),
    // Metrics on within 5% of off.
    metricsVsPing: compare('ping-metrics', 'ping', 0.95),
    traceparentVsPing: compare('ping-traceparent', 'ping', 0.95),
    // Two engine endpoints within 5% of one (its `cpu` is the CPU per request ratio the issue states).
    twoEnginesVsPing: compare('ping-2-engines', 'ping', 0.95),
    // Everything on, info logging included, ping >= 0.6 x nginx.
    prodPingVsNginx: compare('prod-ping', 'nginx', 0.6),
    prodPingVsPing: compare('prod-ping', 'ping', null),
    prodUpdateVsUpdate: compare('prod-update', 'update', null),
    prodCreateVsCreate: compare('prod-create', 'create', null),
    prodRedisPingVsNginx: compare('prod-redis-ping', 'nginx', null),
    prodRedisPingVsProdPing: compare('prod-redis-ping', 'prod-ping', null)
  }
}

const fixed = (v: number | null, digits: number): string => (v === null || Number.isNaN(v) ? '-' : v.toFixed(digits))

const percent = (v: number | null): string => (v === null || Number.isNaN(v) ? '-' : `${Math.round(v * 100)}%`)

const percent1 = (v: number | null): string => (v === null || Number.isNaN(v) ? '-' : `${(v * 100).toFixed(1)}%`)

function cpuCell (cpu: CpuUse | null): string {
  if (cpu === null) return '-'
  return [cpu.server, cpu.mock, cpu.loadgen].map((v) => fixed(v, 2)).join('/')
}

export function formatTable (s: Record<string, ScenarioSummary>): string {
  const header = [
    'scenario',
    'conns',
    'req/s',
    'p50 ms',
    'p99 ms',
    'non-2xx',
    'errors',
    'cpu srv/mock/load',
    'srv us/req',
    'sys',
    'what'
  ]
  const rows = Object.entries(s).map(([name, r]) =>
    r.skipped !== undefined
      ? [name, String(r.connections), '-', '-', '-', '-', '-', '-', '-', '-', `skipped: ${r.skipped}`]
      : [
          name,
          String(r.connections),
          fixed(r.rps, 0),
          fixed(r.p50, 2),
          fixed(r.p99, 2),
          String(r.non2xx),
          String(r.errors),
          cpuCell(r.cpu),
          fixed(r.cpu?.serverUsPerRequest ?? null, 0),
          percent(r.cpu?.serverSystemShare ?? null),
          r.description
        ]
  )
  const widths = header.map((h, i) =>
    Math.max(h.length, ...rows.map((row) => (i === header.length - 1 ? 0 : row[i]!.length)))
  )
  const line = (cells: string[]): string =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!)))
      .join('  ')
  return [line(header), ...rows.map(line)].join('\n')
}

export function formatRatios (r: Record<string, Ratio>): string {
  const lines = Object.entries(r).map(
    ([name, { value, goal, met, cpu }]) =>
      `${name.padEnd(24)} ${fixed(value, 2).padStart(6)}  ${cpu === undefined ? '      ' : `cpu ${fixed(cpu, 2).padStart(5)}`}  goal ${goal}${met === null ? '' : met ? '  (met)' : '  (NOT met)'}`
  )
  return ['ratio                     req/s  cpu/req', ...lines].join('\n')
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

/** The machine a report was measured on, with its load average before and after the run. */
export interface MachineReport {
  cpus: number
  cpuModel: string
  node: string
  platform: string
  date: string
  loadavg1m: { before: number, after: number }
}

/** Describes this machine for a report; `loadBefore` is the 1-minute load average taken before the run. */
export function machineReport (loadBefore: number): MachineReport {
  return {
    cpus: cpus().length,
    cpuModel: cpus()[0]?.model ?? 'unknown',
    node: process.version,
    platform: process.platform,
    date: new Date().toISOString(),
    loadavg1m: { before: loadBefore, after: loadavg()[0] ?? Number.NaN }
  }
}
