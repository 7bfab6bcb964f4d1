/**
 * A one-second run of the load-test harness, so it cannot rot unnoticed. It
 * checks the shape of the JSON report only, never a figure: figures depend on
 * the machine, and this suite runs on shared, noisy ones.
 */
import t from 'tap'
import { dist, isCount, isFigure, runBench, skipUnlessBuilt } from '../helpers/bench.js'

const RUN = dist('bench', 'run.js')

// The report's contract: every scenario appears, run or skipped with a reason.
const SCENARIOS = ['direct', 'nginx', 'ping', 'update', 'create', 'create-10mib', 'ping-logging']
const RATIOS = ['gatewayPingVsNginx', 'gatewayPingP99VsNginx', 'gatewayPingVsDirect', 'updateVsPing', 'loggingVsNginx']

// Seven scenarios, each with a one-second warm-up and a one-second round, plus
// process start-up on a busy machine: well past tap's default per-file limit.
t.setTimeout(180_000)

// The harness runs compiled code (dist/); without a build there is nothing to run.
const skip = skipUnlessBuilt(RUN, dist('src', 'server.js'))

t.test('bench harness: one-second run writes a complete JSON report', { skip }, async (t) => {
  const run = await runBench<{
    machine: Record<string, unknown>
    options: Record<string, unknown>
    scenarios: Record<string, Record<string, unknown>>
    ratios: Record<string, Record<string, unknown>>
  }>(t, RUN, ['--duration', '1', '--connections', '2', '--rounds', '1'], 170_000)
  t.equal(run.code, 0, run.code === 0 ? 'harness exits 0' : `harness exits 0, stderr:\n${run.stderr}`)
  const report = run.report!

  t.ok(isCount(report.machine.cpus), 'machine.cpus')
  t.equal(typeof report.machine.node, 'string', 'machine.node')
  t.ok(!Number.isNaN(Date.parse(String(report.machine.date))), 'machine.date')
  t.match(report.options, { duration: 1, connections: 2, rounds: 1 }, 'options echo the command line')

  t.same(Object.keys(report.scenarios).sort(), [...SCENARIOS].sort(), 'every scenario is in the report')
  for (const name of SCENARIOS) {
    const s = report.scenarios[name]!
    if (s.skipped !== undefined) {
      // Only nginx may be absent (not installed); the gateway scenarios must run.
      t.equal(name, 'nginx', `${name} skipped: ${String(s.skipped)}`)
      t.equal(typeof s.skipped, 'string', `${name}: skip reason`)
      continue
    }
    for (const field of ['rps', 'p50', 'p99']) t.ok(isFigure(s[field]), `${name}.${field} is a number`)
    for (const field of ['non2xx', 'errors']) t.ok(isCount(s[field]), `${name}.${field} is a count`)
    // Not a figure but correctness: a gateway answering 401 or 502 to the load must fail here.
    t.equal(s.non2xx, 0, `${name}: every answer was 2xx`)
    t.equal(s.errors, 0, `${name}: no connection errors`)
    t.ok(Array.isArray(s.rounds) && s.rounds.length === 1, `${name}: one round`)
    const round = (s.rounds as Array<Record<string, unknown>>)[0]
    t.ok(round !== undefined && isFigure(round.rps) && isFigure(round.p99) && isCount(round.non2xx), `${name}: round figures`)
  }

  t.same(Object.keys(report.ratios).sort(), [...RATIOS].sort(), 'every ratio is in the report')
  for (const name of RATIOS) {
    const r = report.ratios[name]!
    t.ok(r.value === null || isFigure(r.value), `${name}.value is a number or null`)
    t.equal(typeof r.goal, 'string', `${name}.goal`)
  }
})
