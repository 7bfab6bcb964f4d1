/**
 * The order of measurements in one round, and each cost row's ratio to its
 * base measured beside it.
 *
 * On a shared machine the CPU a request costs moves with the neighbours: the
 * bare proxy's own rounds have read 66 and 119 µs a request in one run. A
 * ratio of two measurements a minute apart reads that drift as a cost. So in
 * every round each cost row sits next to a measurement of its base (the bare
 * proxy's `bare-ping` or `bare-update`), in runs of a few rows between two
 * base measurements: B X1 X2 B X3 X4 B. A row's base is then read at its own
 * place in the round: the nearest base measurement on each side, weighted by
 * nearness (a straight line between them). For B X B that is the plain mean
 * of the two; for B X1 X2 B, X1 takes 2/3 of the base beside it and 1/3 of
 * the one past X2. Either way a drift that is steady over the few slots
 * cancels, and two rows per base need half the extra base measurements that
 * one row per base does, for a base estimate nearly as precise (its variance
 * is 5/9 of one measurement's against 1/2).
 */

/** What the schedule needs of a scenario: its name, and the base of its cost row if it has one. */
export interface Schedulable {
  name: string
  cost?: { base: string }
}

/** One measurement of a round: the scenario and its server CPU µs per request (NaN when it answered nothing). */
export interface Measurement {
  scenario: string
  usPerRequest: number
}

/** Cost rows between two measurements of their base, by default (run.ts --rows-per-base: 1 or 2). */
export const ROWS_PER_BASE = 2

/** `--compare`'s twin of a scenario is named `<name>@before` (run.ts). */
export const TWIN_SUFFIX = '@before'

/**
 * The scenarios' measurements in one round, by name, in order. Scenarios
 * with no cost row (or whose base is not among `scenarios`) come first, in
 * their order; then for each base, its rows in their order, `rowsPerBase` at a
 * time between two measurements of the base: B X1 X2 B X3 B. A base is
 * measured as often as its rows need; its own row (bare-ping's 1.00) is one
 * of those measurements.
 */
export function roundSchedule (scenarios: readonly Schedulable[], rowsPerBase = ROWS_PER_BASE): string[] {
  // Three or more and a row in the middle would not be next to its base.
  if (rowsPerBase !== 1 && rowsPerBase !== 2) { throw new Error(`rows per base ${rowsPerBase}: expected 1 or 2, so every row is next to its base`) }
  const names = new Set(scenarios.map((s) => s.name))
  const baseOf = (s: Schedulable): string | undefined =>
    s.cost !== undefined && s.cost.base !== s.name && names.has(s.cost.base) ? s.cost.base : undefined
  const bases = [...new Set(scenarios.flatMap((s) => baseOf(s) ?? []))]
  const order = scenarios.filter((s) => baseOf(s) === undefined && !bases.includes(s.name)).map((s) => s.name)
  for (const base of bases) {
    const rows = scenarios.filter((s) => baseOf(s) === base).map((s) => s.name)
    order.push(base)
    for (const run of runsOf(rows, rowsPerBase)) order.push(...run, base)
  }
  return order
}

/**
 * The rows in runs of at most `rowsPerBase`, in order, where a row and its
 * `--compare` twin always share a run (with two rows per base): the two
 * builds are then measured between the same two base measurements.
 */
function runsOf (rows: readonly string[], rowsPerBase: number): string[][] {
  const units: string[][] = []
  for (const row of rows) {
    const original = row.endsWith(TWIN_SUFFIX) ? row.slice(0, -TWIN_SUFFIX.length) : undefined
    const unit =
      rowsPerBase === 2 && original !== undefined ? units.find((u) => u.length === 1 && u[0] === original) : undefined
    if (unit !== undefined) unit.push(row)
    else units.push([row])
  }
  const runs: string[][] = []
  for (const unit of units) {
    const last = runs.at(-1)
    if (unit.length === 1 && last !== undefined && last.length < rowsPerBase) last.push(...unit)
    else runs.push([...unit])
  }
  return runs
}

const usable = (m: Measurement | undefined, base: string): m is Measurement =>
  m !== undefined && m.scenario === base && Number.isFinite(m.usPerRequest) && m.usPerRequest > 0

/**
 * The base's CPU per request at position `at` of a round: the nearest usable
 * measurement of `base` before and after it, weighted by nearness, or the
 * only side there is; NaN when the round has none.
 */
export function baseAt (round: readonly Measurement[], at: number, base: string): number {
  let before = at - 1
  while (before >= 0 && !usable(round[before], base)) before--
  let after = at + 1
  while (after < round.length && !usable(round[after], base)) after++
  const b = before >= 0 ? round[before]!.usPerRequest : undefined
  const a = after < round.length ? round[after]!.usPerRequest : undefined
  if (b !== undefined && a !== undefined) return (b * (after - at) + a * (at - before)) / (after - before)
  return b ?? a ?? Number.NaN
}

/**
 * One round's CPU per request of `scenario` over its base's at its place
 * (baseAt); 1 for the base itself. NaN when either is missing from the round.
 */
export function ratioInRound (
  round: readonly Measurement[],
  scenario: string,
  base: string
): { usPerRequest: number; baseUsPerRequest: number; ratio: number } {
  if (scenario === base) {
    const own = round.filter((m) => usable(m, base)).map((m) => m.usPerRequest)
    const mean = own.length === 0 ? Number.NaN : own.reduce((sum, v) => sum + v, 0) / own.length
    return { usPerRequest: mean, baseUsPerRequest: mean, ratio: own.length === 0 ? Number.NaN : 1 }
  }
  const at = round.findIndex((m) => m.scenario === scenario)
  const usPerRequest = at < 0 ? Number.NaN : round[at]!.usPerRequest
  const baseUsPerRequest = at < 0 ? Number.NaN : baseAt(round, at, base)
  return { usPerRequest, baseUsPerRequest, ratio: usPerRequest / baseUsPerRequest }
}

/** Seconds of unmeasured load each server process gets once, before the first round (run.ts --settle). */
export const SETTLE_DEFAULT_S = 10

/**
 * The settling before the first round, per server process (`target`): the
 * same `seconds` for every process, split evenly among the scenarios it
 * serves, so the gateway behind six scenarios is not settled six times as
 * long as the bare proxy it is measured against. Empty when `seconds` is 0.
 */
export function settleShares<S extends { target: string }> (
  scenarios: readonly S[],
  seconds: number
): Map<string, Array<{ scenario: S; seconds: number }>> {
  const byTarget = new Map<string, S[]>()
  for (const s of seconds > 0 ? scenarios : []) {
    const list = byTarget.get(s.target)
    if (list === undefined) byTarget.set(s.target, [s])
    else list.push(s)
  }
  return new Map(
    [...byTarget].map(([target, list]) => [
      target,
      list.map((scenario) => ({ scenario, seconds: seconds / list.length }))
    ])
  )
}
