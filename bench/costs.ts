/**
 * The cost table (DECISIONS 30): each row's server CPU per request as a ratio
 * to the bare proxy's, and each feature's own share of it, from the same run.
 * A ratio is taken per round against the base measured right beside the row
 * in that round (bench/schedule.ts: a minute apart on a shared machine, the
 * base itself moves by half), and the median of the rounds is reported. Also the open-loop latency of the bare proxy
 * and the everything-on
 * gateway, and the markdown both go into.
 */
import { readFile, writeFile } from 'node:fs/promises'
import { median, type ScenarioSummary } from './report.js'
import type { Scenario } from './scenarios.js'
import { ratioInRound, type Measurement } from './schedule.js'

export interface CostRowReport {
  scenario: string
  feature: string
  base: string
  /** The scenario the feature is added to; null for the baselines and combinations. */
  adds: string | null
  /** Median server CPU µs per request. */
  cpuUsPerRequest: number | null
  /** Median over rounds of this / base, server CPU per request, the base measured beside this in each round
   * (bench/schedule.ts).
   */
  ratio: number | null
  /** Median over rounds of this / base - adds / base: the feature's own cost in units of the bare proxy. */
  share: number | null
  goal: string
  /** null when there is no goal or no figure. */
  met: boolean | null
  rounds: number
  /** Each round's figures: this row's CPU µs per request, its base's at its place in the round, and their ratio. */
  perRound: Array<{ cpuUsPerRequest: number | null; baseUsPerRequest: number | null; ratio: number | null }>
  /** Why the row has no figures. */
  skipped?: string
}

export interface CostReport {
  baseline: string
  rows: CostRowReport[]
}

export interface LatencyPoint {
  scenario: string
  /** Offered rate / the everything-on gateway's measured capacity. */
  multiple: number
  offeredRps: number
  p50: number
  p99: number
  non2xx: number
  errors: number
}

/** One step of the open loop's capacity search. */
export interface CapacityStep {
  offeredRps: number
  /** 2xx per second, over the time until the last answer. */
  goodputRps: number
  non2xx: number
  /** Errors, and requests due but never sent. */
  errors: number
  p99: number
  /** Cores busy meanwhile: the gateway's processes, and the generator (this harness). */
  cpu: { server: number; generator: number }
  sustained: boolean
}

/**
 * A step is sustained when it was answered in full: every answer 2xx, no error and nothing left unsent, and
 * 2xx per second at least this share of the offer (a queue that grew). Latency is not a test: a slow step
 * that kept up still counts (its p99 is reported beside it).
 */
export const SUSTAINED_SHARE = 0.97
/** Each step of the search offers this multiple of the one before. */
export const CAPACITY_STEP = 1.15
/** The search starts at this share of the closed loop's rate. */
export const CAPACITY_START = 0.3
/** And takes at most this many steps (from 0.3 to 0.3 x 1.15^11 = 1.4 times the closed loop's rate). */
export const CAPACITY_STEPS_MAX = 12

export function isSustained (step: Omit<CapacityStep, 'sustained'>): boolean {
  return step.non2xx === 0 && step.errors === 0 && step.goodputRps >= SUSTAINED_SHARE * step.offeredRps
}

/**
 * The capacity from the steps, offered in increasing order: the highest
 * offered rate sustained before the first step that was not. `bounded` is
 * false when no step failed (the capacity is then only a lower bound), and
 * the capacity is null when the first step already failed.
 */
export function capacityOf (steps: readonly CapacityStep[]): { rps: number | null; bounded: boolean } {
  let rps: number | null = null
  for (const step of steps) {
    if (!step.sustained) return { rps, bounded: true }
    rps = step.offeredRps
  }
  return { rps, bounded: false }
}

export interface LatencyReport {
  capacityFrom: string
  /** The highest offered rate `capacityFrom` sustained in the open loop (capacityOf): the offered loads are multiples
   * of it.
   */
  capacityRps: number
  /** False when every step of the search was sustained: the capacity is then a lower bound. */
  capacityBounded: boolean
  /** The median closed-loop round's rate (autocannon), from which the search starts. */
  closedLoopRps: number
  /** The search, step by step. */
  capacitySteps: CapacityStep[]
  baseline: string
  points: LatencyPoint[]
  verdict: { value: number | null; goal: string; met: boolean | null }
}

const round3 = (v: number): number | null => (Number.isFinite(v) ? Math.round(v * 1000) / 1000 : null)

export function costTable (
  scenarios: readonly Scenario[],
  summaries: Record<string, ScenarioSummary>,
  measured: ReadonlyArray<readonly Measurement[]>
): CostReport {
  const rows: CostRowReport[] = []
  for (const s of scenarios) {
    if (s.cost === undefined) continue
    const summary = summaries[s.name]
    if (summary === undefined) continue
    const { cost } = s
    const goals = [
      ...(cost.goal?.ratio === undefined ? [] : [`ratio <= ${cost.goal.ratio.toFixed(2)}`]),
      ...(cost.goal?.share === undefined ? [] : [`share <= ${Math.round(cost.goal.share * 100)}%`])
    ]
    const row: CostRowReport = {
      scenario: s.name,
      feature: cost.feature,
      base: cost.base,
      adds: cost.adds ?? null,
      cpuUsPerRequest: null,
      ratio: null,
      share: null,
      goal: goals.length === 0 ? 'informational' : goals.join(', '),
      met: null,
      rounds: 0,
      perRound: []
    }
    const base = summaries[cost.base]
    const skipped = summary.skipped ?? base?.skipped ?? (base === undefined ? `${cost.base} was not run` : undefined)
    if (skipped !== undefined) {
      rows.push({ ...row, skipped })
      continue
    }
    // Each round's ratio against the base measured beside the row (bench/schedule.ts).
    const inRounds = measured.map((round) => ratioInRound(round, s.name, cost.base))
    const own = inRounds.filter((r) => Number.isFinite(r.ratio))
    // The share needs the scenario the feature is added to, run and not skipped: the two ratios' difference in
    // each round, each against its own neighbouring base, so the time between the two cancels as well.
    const adds =
      cost.adds === undefined || summaries[cost.adds] === undefined || summaries[cost.adds]!.skipped !== undefined
        ? undefined
        : cost.adds
    const shares =
      adds === undefined
        ? []
        : measured
            .map((round, i) => inRounds[i]!.ratio - ratioInRound(round, adds, cost.base).ratio)
            .filter(Number.isFinite)
    const ratio = round3(median(own.map((r) => r.ratio)))
    const share = shares.length === 0 ? null : round3(median(shares))
    const checks = [
      ...(cost.goal?.ratio === undefined || ratio === null ? [] : [ratio <= cost.goal.ratio]),
      ...(cost.goal?.share === undefined || share === null ? [] : [share <= cost.goal.share])
    ]
    rows.push({
      ...row,
      cpuUsPerRequest: round3(median(own.map((r) => r.usPerRequest))),
      ratio,
      share,
      met: checks.length === 0 ? null : checks.every(Boolean),
      rounds: own.length,
      perRound: own.map((r) => ({
        cpuUsPerRequest: round3(r.usPerRequest),
        baseUsPerRequest: round3(r.baseUsPerRequest),
        ratio: round3(r.ratio)
      }))
    })
  }
  return { baseline: 'bare-ping', rows }
}

/** Target: p99 at 90% of capacity, everything on, at most 1.5 x the bare proxy's at the same offered load. */
export function latencyVerdict (points: LatencyPoint[], bare: string, full: string): LatencyReport['verdict'] {
  const at = (name: string): number | undefined => points.find((p) => p.scenario === name && p.multiple === 0.9)?.p99
  const a = at(full)
  const b = at(bare)
  const value =
    a === undefined || b === undefined || !Number.isFinite(a) || !Number.isFinite(b) || b === 0 ? null : round3(a / b)
  return {
    value,
    goal: '<= 1.5 (p99 at 0.9 x capacity, everything on / bare proxy)',
    met: value === null ? null : value <= 1.5
  }
}

const fixed = (v: number | null, digits: number): string =>
  v === null || !Number.isFinite(v) ? '-' : v.toFixed(digits)
const signedPercent = (v: number | null): string => (v === null ? '' : `${v >= 0 ? '+' : ''}${(v * 100).toFixed(1)}%`)
const verdict = (met: boolean | null): string => (met === null ? '' : met ? 'met' : 'NOT met')

export function formatCosts (costs: CostReport): string {
  const lines = costs.rows.map((r) =>
    r.skipped !== undefined
      ? `${r.scenario.padEnd(20)} skipped: ${r.skipped}`
      : `${r.scenario.padEnd(20)} ${fixed(r.cpuUsPerRequest, 0).padStart(6)} us  x${fixed(r.ratio, 2).padStart(5)}  ${signedPercent(r.share).padStart(7)}  ${r.goal}${r.met === null ? '' : `  (${verdict(r.met)})`}  ${r.feature}`
  )
  return [
    `cost per request, server CPU, as a ratio to ${costs.baseline} (median of per-round ratios, each against the base measured beside the row); share: the feature's own cost over the bare proxy's`,
    ...lines
  ].join('\n')
}

function formatStep (step: CapacityStep): string {
  return `  search ${String(step.offeredRps).padStart(7)} req/s offered: 2xx ${String(step.goodputRps).padStart(7)}/s  non-2xx ${step.non2xx}  errors ${step.errors}  p99 ${fixed(step.p99, 1)} ms  CPU gateway ${fixed(step.cpu.server, 2)} generator ${fixed(step.cpu.generator, 2)}  ${step.sustained ? 'sustained' : 'NOT sustained'}`
}

export function formatLatency (latency: LatencyReport): string {
  const lines = latency.points.map(
    (p) =>
      `${p.scenario.padEnd(12)} ${`${p.multiple}x`.padStart(5)} ${String(p.offeredRps).padStart(7)} req/s  p50 ${fixed(p.p50, 2).padStart(7)} ms  p99 ${fixed(p.p99, 2).padStart(7)} ms  non-2xx ${p.non2xx}  errors ${p.errors}`
  )
  return [
    `latency: open loop at multiples of ${latency.capacityFrom}'s capacity in the open loop (${latency.capacityRps} req/s${latency.capacityBounded ? '' : ', a lower bound'}; closed loop ${latency.closedLoopRps})`,
    ...latency.capacitySteps.map(formatStep),
    ...lines,
    `p99 at 0.9x, ${latency.capacityFrom} / ${latency.baseline}: ${fixed(latency.verdict.value, 2)}  goal ${latency.verdict.goal}${latency.verdict.met === null ? '' : `  (${verdict(latency.verdict.met)})`}`
  ].join('\n')
}

export interface MarkdownInput {
  machine: { cpus: number; cpuModel: string; node: string; date: string; loadavg1m: { before: number; after: number } }
  command: string
  /** Rounds the medians are taken over. */
  rounds: number
  /** Cost rows between two measurements of their base (bench/schedule.ts). */
  rowsPerBase: number
  costs: CostReport
  latency: LatencyReport | { skipped: string } | null
  /** The cost chart, relative to the markdown file. */
  chart?: string
}

export const BEGIN =
  '<!-- bench:begin (written by `npm run bench -- --markdown`; edits between these lines are replaced) -->'
export const END = '<!-- bench:end -->'

export function costMarkdown (input: MarkdownInput): string {
  const { machine, costs, latency } = input
  const out: string[] = [
    `Measured ${machine.date.slice(0, 16).replace('T', ' ')} UTC on ${machine.cpus} × ${machine.cpuModel}, Node ${machine.node}, ` +
      `load average ${machine.loadavg1m.before.toFixed(2)} → ${machine.loadavg1m.after.toFixed(2)}, with:`,
    '',
    '```sh',
    input.command,
    '```',
    '',
    `Server CPU per request (utime + stime of the server process from \`/proc\`) as a ratio to \`${costs.baseline}\`, ` +
      `${input.rounds === 1 ? 'from a single round (not a median: rerun with --rounds 3 or more)' : `the median of ${input.rounds} per-round ratios`}. In every round each row is measured next to its base (\`bare-ping\` or \`bare-update\`, ` +
      `at most ${input.rowsPerBase === 1 ? 'one row' : `${input.rowsPerBase} rows`} between two measurements of it), and its ratio is taken against the base at its place: the base's ` +
      'measurements on either side, weighted by nearness. *Own share*: what the feature adds to the ' +
      "bare gateway (or bare update), in units of the bare proxy's cost per request (the row's ratio less the bare gateway's, per round).",
    '',
    '| Scenario | What is on | CPU µs/req | × bare proxy | Own share | Goal | |',
    '|---|---|---:|---:|---:|---|---|'
  ]
  for (const r of costs.rows) {
    out.push(
      r.skipped !== undefined
        ? `| \`${r.scenario}\` | ${r.feature} | – | – | – | ${r.goal} | skipped: ${r.skipped.replace(/\|/g, '/')} |`
        : `| \`${r.scenario}\` | ${r.feature} | ${fixed(r.cpuUsPerRequest, 0)} | ${fixed(r.ratio, 2)} | ${signedPercent(r.share) || '–'} | ${r.goal} | ${verdict(r.met)} |`
    )
  }
  if (input.chart !== undefined) out.push('', `![CPU per request as a ratio to the bare proxy](${input.chart})`)
  out.push('', '### Latency for phones (open loop)', '')
  if (latency === null) out.push('Not run.')
  else if ('skipped' in latency) out.push(`Skipped: ${latency.skipped}.`)
  else {
    out.push(
      `Requests due at a fixed rate (latency counted from when each was due), at ${[...new Set(latency.points.map((p) => p.multiple))].map((m) => `${m * 100}%`).join(' and ')} ` +
        `of \`${latency.capacityFrom}\`'s capacity (${latency.capacityRps} req/s: the highest rate it answered in full: only 2xx, nothing unsent, 2xx per second at least ${Math.round(SUSTAINED_SHARE * 100)}% of the offer, in an open-loop search that steps the offer up by ${CAPACITY_STEP}x until a step fails${latency.capacityBounded ? '' : '; no step failed, so this is a lower bound'}; the closed loop read ${latency.closedLoopRps}); both targets get the same offered load.`,
      '',
      '| Search step | 2xx/s | non-2xx | errors | p99 ms | CPU gateway | CPU generator | |',
      '|---:|---:|---:|---:|---:|---:|---:|---|',
      ...latency.capacitySteps.map(
        (st) =>
          `| ${st.offeredRps} | ${st.goodputRps} | ${st.non2xx} | ${st.errors} | ${fixed(st.p99, 1)} | ${fixed(st.cpu.server, 2)} | ${fixed(st.cpu.generator, 2)} | ${st.sustained ? 'sustained' : 'not sustained'} |`
      ),
      '',
      '| Target | Offered | req/s | p50 ms | p99 ms | non-2xx | errors |',
      '|---|---:|---:|---:|---:|---:|---:|'
    )
    for (const p of latency.points) {
      out.push(
        `| \`${p.scenario}\` | ${p.multiple * 100}% | ${p.offeredRps} | ${fixed(p.p50, 2)} | ${fixed(p.p99, 2)} | ${p.non2xx} | ${p.errors} |`
      )
    }
    out.push(
      '',
      `p99 at 90%, everything on / bare proxy: **${fixed(latency.verdict.value, 2)}** (goal ${latency.verdict.goal}${latency.verdict.met === null ? '' : `: ${verdict(latency.verdict.met)}`}).`
    )
  }
  return out.join('\n')
}

/** Write the generated part between BEGIN and END, keeping the rest of the file (or make a file with only it). */
export async function writeMarkdown (file: string, input: MarkdownInput): Promise<void> {
  const existing = await readFile(file, 'utf8').catch(() => '')
  const generated = `${BEGIN}\n${costMarkdown(input)}\n${END}`
  const start = existing.indexOf('<!-- bench:begin')
  const end = existing.indexOf(END)
  const text =
    start >= 0 && end > start
      ? existing.slice(0, start) + generated + existing.slice(end + END.length)
      : `${existing}${existing === '' || existing.endsWith('\n\n') ? '' : '\n'}${generated}\n`
  await writeFile(file, text)
}
