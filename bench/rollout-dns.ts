/**
 * Figures for a rollout by DNS (DECISIONS 24): the scenario of
 * test/engine-client/rollout.test.ts (both engines replaced, each new one added to
 * the name, then an old one removed and sent SIGTERM at once, under a steady
 * load of pings and updates), with the load kept up long enough after the
 * rollout to see how long the gateway keeps answering 502. Prints the count of
 * failed answers by status and the time from the first failure to the end of
 * the last one.
 *
 *   node dist/bench/rollout-dns.js [--refresh-ms 30000] [--after-ms 35000]
 *
 * Without --refresh-ms, the gateway's default DNS refresh. Needs dist/ built
 * and Debian's redis-server.
 */
import { parseArgs } from 'node:util'
import { rollout } from '../test/helpers/rollout.js'

const { values } = parseArgs({ options: { 'refresh-ms': { type: 'string' }, 'after-ms': { type: 'string', default: '35000' } } })
const teardowns: Array<() => unknown> = []
const t = { teardown: (fn: () => unknown) => { teardowns.push(fn) } }
try {
  const refreshMs = values['refresh-ms'] === undefined ? undefined : Number(values['refresh-ms'])
  const result = await rollout(t as never, { ...(refreshMs === undefined ? {} : { refreshMs }), healthMs: 200, noticeMs: 600, workers: 4, pauseMs: 40, surgeMs: 300, afterMs: Number(values['after-ms']) })
  const zero = result.steps[0]!.at
  const failed = result.outcomes.filter((o) => o.status !== 200)
  const byStatus: Record<string, number> = {}
  for (const o of failed) byStatus[o.status] = (byStatus[o.status] ?? 0) + 1
  const first = failed.length === 0 ? undefined : Math.min(...failed.map((o) => o.start))
  const last = failed.length === 0 ? undefined : Math.max(...failed.map((o) => o.end))
  process.stdout.write(JSON.stringify({
    refreshMs: refreshMs ?? 'default',
    requests: result.outcomes.length,
    failed: failed.length,
    byStatus,
    failingFromMs: first === undefined ? null : Math.round(first - zero),
    failingForMs: first === undefined ? 0 : Math.round(last! - first),
    steps: result.steps.map((s) => `${s.what} at ${Math.round(s.at - zero)} ms`),
    exits: result.exits,
    sample: [...new Set(result.failures)].slice(0, 3)
  }, null, 2) + '\n')
} finally {
  for (const fn of teardowns.reverse()) await fn()
}
