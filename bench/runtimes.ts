/**
 * `--runtime LABEL=NODE[,DIST]` (run.ts): every selected scenario whose server
 * the harness starts (the bare proxies and the gateways) runs once per runtime,
 * under that node binary and from that build's dist/, as `<scenario>@<label>`.
 * In each round the copies of one scenario are measured back to back, their
 * order turned by one each round, so a drift through the round falls on every
 * runtime alike; a runtime's figure is read as a ratio to the first runtime's
 * measurement of the same scenario in the same round.
 */
import path from 'node:path'
import type { Measurement } from './schedule.js'
import { median } from './report.js'
import type { Scenario } from './scenarios.js'

export interface Runtime {
  /** Names the copies (`ping@node20`) and the table's columns. */
  label: string
  /** The node binary that runs the servers. */
  node: string
  /** The dist/ folder the servers' scripts come from. */
  dist: string
}

/** `LABEL=NODE[,DIST]`; DIST defaults to `ownDist`, the harness's own build. */
export function parseRuntime (text: string, ownDist: string): Runtime {
  const m = /^([A-Za-z0-9_.-]+)=([^,]+)(?:,(.+))?$/.exec(text)
  if (m === null) {
    throw new Error(`--runtime ${text}: expected LABEL=NODE or LABEL=NODE,DIST ` +
      '(e.g. node20=/usr/bin/node,/work/old/dist)')
  }
  return { label: m[1]!, node: path.resolve(m[2]!), dist: path.resolve(m[3] ?? ownDist) }
}

/** Targets that run from a build: the bare proxies and every gateway (never the mock or nginx). */
const fromBuild = (s: Scenario): boolean => s.target !== 'mock' && s.target !== 'nginx'

/**
 * One copy of each scenario per runtime, in scenario order, the copies of one
 * scenario together; their target is `<target>@<label>`, and they have no
 * cost row (the cost table's bases are per build).
 */
export function withRuntimes (scenarios: readonly Scenario[], runtimes: readonly Runtime[]): Scenario[] {
  return scenarios.filter(fromBuild).flatMap((s) => runtimes.map((r): Scenario => {
    const { cost: _cost, ...rest } = s
    const copy = {
      name: `${s.name}@${r.label}`,
      description: `${s.description} [${r.label}]`,
      target: `${s.target}@${r.label}`
    }
    return { ...rest, ...copy }
  }))
}

/**
 * Round `round`'s order (1-based): each scenario's copies back to back, the
 * runtimes turned by one per round (A B C, then B C A, then C A B).
 */
export function runtimeSchedule (names: readonly string[], runtimes: readonly Runtime[], round: number): string[] {
  const labels = runtimes.map((r) => r.label)
  const originals = [...new Set(names.map((n) => n.slice(0, n.lastIndexOf('@'))))]
  const shift = (round - 1) % labels.length
  const turned = [...labels.slice(shift), ...labels.slice(0, shift)]
  return originals.flatMap((o) => turned.map((l) => `${o}@${l}`).filter((n) => names.includes(n)))
}

export interface RuntimeRow {
  scenario: string
  /** Per runtime label: the median CPU µs per request over the rounds. */
  usPerRequest: Record<string, number>
  /** Per runtime label: the median of the per-round ratios to the first runtime's measurement (1 for the first). */
  ratioToFirst: Record<string, number>
  /** Per runtime label: the median of the per-round ratios to `bare-ping` on the same runtime. */
  ratioToBare: Record<string, number>
  /** Per runtime label: each round's ratio to the first runtime. */
  perRound: Record<string, number[]>
}

const round3 = (n: number): number => Math.round(n * 1000) / 1000

/** The runtime table: for each scenario, each runtime's cost and its ratio to the first runtime's. */
export function runtimeTable (
  originals: readonly string[],
  runtimes: readonly Runtime[],
  measured: ReadonlyArray<readonly Measurement[]>
): RuntimeRow[] {
  const first = runtimes[0]!.label
  const inRound = (round: readonly Measurement[], name: string): number => {
    const m = round.find((x) => x.scenario === name)
    return m !== undefined && Number.isFinite(m.usPerRequest) && m.usPerRequest > 0 ? m.usPerRequest : Number.NaN
  }
  const finite = (xs: number[]): number[] => xs.filter(Number.isFinite)
  return originals.map((scenario) => {
    const row: RuntimeRow = { scenario, usPerRequest: {}, ratioToFirst: {}, ratioToBare: {}, perRound: {} }
    for (const { label } of runtimes) {
      const own = measured.map((round) => inRound(round, `${scenario}@${label}`))
      const toFirst = measured.map((round, i) => own[i]! / inRound(round, `${scenario}@${first}`))
      const toBare = measured.map((round, i) => own[i]! / inRound(round, `bare-ping@${label}`))
      row.usPerRequest[label] = Math.round(median(finite(own)))
      row.ratioToFirst[label] = round3(median(finite(toFirst)))
      row.ratioToBare[label] = round3(median(finite(toBare)))
      row.perRound[label] = toFirst.map(round3)
    }
    return row
  })
}

/** The runtime table as Markdown: CPU µs per request, each runtime against the first and against its bare proxy. */
export function formatRuntimeMarkdown (rows: readonly RuntimeRow[], runtimes: readonly Runtime[]): string {
  const [first, ...rest] = runtimes
  const head = [
    'Scenario',
    ...runtimes.map((r) => `${r.label} µs/req`),
    ...rest.map((r) => `${r.label} / ${first!.label}`),
    ...runtimes.map((r) => `${r.label} × its bare proxy`)
  ]
  const lines = [`| ${head.join(' | ')} |`, `|${head.map((_, i) => i === 0 ? '---' : '---:').join('|')}|`]
  const fixed = (n: number | undefined, digits: number): string =>
    n === undefined || !Number.isFinite(n) ? '–' : n.toFixed(digits)
  for (const row of rows) {
    lines.push(`| \`${row.scenario}\` | ${[
      ...runtimes.map((r) => fixed(row.usPerRequest[r.label], 0)),
      ...rest.map((r) => fixed(row.ratioToFirst[r.label], 2)),
      ...runtimes.map((r) => fixed(row.ratioToBare[r.label], 2))
    ].join(' | ')} |`)
  }
  return lines.join('\n')
}
