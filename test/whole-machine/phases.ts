/**
 * The chaos test's bookkeeping: which requests belong to which event (those
 * that started while it lasted), and the table of what each event cost.
 */
import type { Outcome } from './load.js'

export interface Phase {
  name: string
  /** performance.now() */
  start: number
  end: number
  /** Moments inside the phase: kill, promoted, recovered, engine-1 exited. */
  marks: Record<string, number>
}

export function inPhase (outcomes: Outcome[], phase: Phase): Outcome[] {
  return outcomes.filter((o) => o.start >= phase.start && o.start < phase.end)
}

/** "200 x812, 503 x4": the statuses of a set of requests, most frequent first. */
export function statusCounts (outcomes: Outcome[]): string {
  const counts = new Map<string, number>()
  for (const o of outcomes) counts.set(String(o.status), (counts.get(String(o.status)) ?? 0) + 1)
  return [...counts].sort((a, b) => b[1] - a[1]).map(([s, n]) => `${s} x${n}`).join(', ')
}

export function costTable (phases: Phase[], outcomes: Outcome[]): string[] {
  const rows = ['| event | duration | requests (h1 / h2) | failed | failures by status and call | notes |', '|---|---:|---:|---:|---|---|']
  for (const p of phases) {
    const mine = inPhase(outcomes, p)
    const failed = mine.filter((o) => o.status !== 200)
    const byCall = (['ping', 'update', 'create'] as const).map((op) => [op, failed.filter((o) => o.op === op)] as const)
      .filter(([, list]) => list.length > 0).map(([op, list]) => `${op}: ${statusCounts(list)}`).join('; ')
    // Moments are counted from the kill when there is one, else from the event's start.
    const from = p.marks['kill'] === undefined ? 'the start' : 'the kill'
    const notes = Object.entries(p.marks).filter(([label]) => label !== 'kill')
      .map(([label, at]) => `${label} ${((at - (p.marks['kill'] ?? p.start)) / 1000).toFixed(1)} s after ${from}`).join(', ')
    const h1 = mine.filter((o) => o.proto === 'h1').length
    rows.push(`| ${p.name} | ${((p.end - p.start) / 1000).toFixed(1)} s | ${mine.length} (${h1} / ${mine.length - h1}) | ${failed.length} | ${byCall || '-'} | ${notes || '-'} |`)
  }
  return rows
}
