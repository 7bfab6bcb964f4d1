/**
 * A short run of the load-test harness, so it cannot rot unnoticed: every
 * scenario for 0.8 s, the open loop past saturation, the chart. It
 * checks the shape of the JSON report and that every answer was the one
 * expected (2xx; past saturation also 503/429), never a figure: figures
 * depend on the machine, and this suite runs on shared, noisy ones.
 */
import { readFile, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import t from 'tap'
import { dist, isCount, isFigure, runBench, skipUnlessBuilt } from '../helpers/bench.js'

const RUN = dist('bench', 'run.js')

// The report's contract: every scenario appears, run or skipped with a reason.
const SCENARIOS = [
  'direct', 'nginx', 'ping', 'update', 'create', 'create-10mib', 'ping-logging',
  'ping-jwks', 'ping-ratelimit', 'ping-redis', 'ping-redis-cluster', 'ping-redis-users', 'ping-metrics', 'ping-traceparent', 'update-idempotent',
  'prod-ping', 'prod-update', 'prod-create', 'prod-redis-ping', 'prod-redis-update', 'prod-redis-create', 'ping-2-engines'
]
const RATIOS = [
  'gatewayPingVsNginx', 'gatewayPingP99VsNginx', 'gatewayPingVsDirect', 'updateVsPing', 'loggingVsNginx', 'loggingVsPing',
  'keySetVsHs256Ping', 'rateLimitVsPing', 'redisLimitVsPing', 'redisClusterLimitVsPing', 'redisLimitUsersVsPing', 'idempotentVsUpdate', 'metricsVsPing', 'traceparentVsPing', 'twoEnginesVsPing',
  'prodPingVsNginx', 'prodPingVsPing', 'prodUpdateVsUpdate', 'prodCreateVsCreate', 'prodRedisPingVsNginx', 'prodRedisPingVsProdPing'
]
/** The features a scenario may be skipped for, while they are not on this branch. */
const FEATURES = ['jwks', 'rate-limit', 'redis', 'redis-cluster', 'idempotency', 'metrics', 'shedding', 'traceparent']

// Twenty-one scenarios with a short warm-up and a one-second round, four
// one-second open-loop steps, and ten gateways and a three-node cluster to start on a busy machine.
t.setTimeout(180_000)

// The harness runs compiled code (dist/); without a build there is nothing to run.
const skip = skipUnlessBuilt(RUN, dist('src', 'server.js'))

t.test('bench harness: one-second run writes a complete JSON report and a chart', { skip }, async (t) => {
  const chart = path.join(tmpdir(), `bench-smoke-chart-${process.pid}.svg`)
  t.teardown(async () => await rm(chart, { force: true }))
  const run = await runBench<{
    machine: Record<string, unknown>
    options: Record<string, unknown>
    features: Record<string, string>
    scenarios: Record<string, Record<string, unknown>>
    ratios: Record<string, Record<string, unknown>>
    saturation: { scenario: string, capacityRps: number, points: Array<Record<string, unknown>>, verdict: Record<string, unknown> } | null
  }>(t, RUN, ['--duration', '0.8', '--connections', '2', '--rounds', '1', '--warmup', '0.1', '--saturation-connections', '8', '--chart', chart], 170_000)
  t.equal(run.code, 0, run.code === 0 ? 'harness exits 0' : `harness exits 0, stderr:\n${run.stderr}`)
  const report = run.report!

  t.ok(isCount(report.machine.cpus), 'machine.cpus')
  t.equal(typeof report.machine.node, 'string', 'machine.node')
  t.ok(!Number.isNaN(Date.parse(String(report.machine.date))), 'machine.date')
  t.match(report.options, { duration: 0.8, connections: 2, rounds: 1, saturationConnections: 8 }, 'options echo the command line')
  const missing = Object.keys(report.features)
  t.same(missing.filter((f) => !FEATURES.includes(f)), [], 'features: only known ones reported missing')

  t.same(Object.keys(report.scenarios).sort(), [...SCENARIOS].sort(), 'every scenario is in the report')
  for (const name of SCENARIOS) {
    const s = report.scenarios[name]!
    if (s.skipped !== undefined) {
      // nginx may be absent (not installed); a feature scenario only while its feature is not in the build.
      const reason = String(s.skipped)
      const allowed = name === 'nginx' ? /not installed/.test(reason) : missing.some((f) => reason.startsWith(`${f}: `))
      t.ok(allowed, `${name} skipped: ${reason}`)
      t.notOk(name === 'prod-ping' || name === 'prod-update' || name === 'prod-create', `${name}: the production profile always runs`)
      continue
    }
    for (const field of ['rps', 'p50', 'p99']) t.ok(isFigure(s[field]), `${name}.${field} is a number`)
    for (const field of ['non2xx', 'errors']) t.ok(isCount(s[field]), `${name}.${field} is a count`)
    // Not a figure but correctness: a gateway answering 401, 429 or 502 to the load must fail here.
    t.equal(s.non2xx, 0, `${name}: every answer was 2xx${s.non2xx === 0 ? '' : `: ${JSON.stringify(s.statusCodes)} ${JSON.stringify(s.probe)}`}`)
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

  // Past saturation: four offered rates on the everything-on gateway; only 503 and 429 may refuse.
  const sat = report.saturation
  t.ok(sat !== null && 'points' in sat, 'saturation ran')
  t.equal(sat?.scenario, 'prod-ping', 'on the everything-on ping')
  t.ok(isFigure(sat?.capacityRps) && sat!.capacityRps > 0, 'capacity measured')
  t.same(sat?.points.map((p) => p.multiple), [0.5, 1, 1.5, 2], 'offered at 0.5, 1, 1.5 and 2 x capacity')
  for (const p of sat?.points ?? []) {
    const label = `${String(p.multiple)}x`
    t.equal(p.offeredRps, Math.max(1, Math.round(sat!.capacityRps * Number(p.multiple))), `${label}: offered rate`)
    for (const field of ['goodputRps', 'answeredRps']) t.ok(isCount(p[field]), `${label}.${field}`)
    t.ok(isFigure(p.p99Accepted), `${label}: p99 of accepted`)
    for (const field of ['shedShare', 'limitedShare']) t.ok(isFigure(p[field]) && Number(p[field]) <= 1, `${label}.${field} is a share`)
    t.equal(p.otherNon2xx, 0, `${label}: every refusal was a 503 or a 429: ${JSON.stringify(p.statusCodes)}`)
    t.equal(p.errors, 0, `${label}: no connection errors`)
    t.ok(isCount(p.notSent), `${label}: notSent`)
  }
  t.equal(typeof sat?.verdict.goal, 'string', 'saturation verdict')

  const svg = await readFile(chart, 'utf8')
  t.match(svg, /^<svg xmlns="http:\/\/www.w3.org\/2000\/svg"/, 'the chart is an SVG document')
  t.match(svg, /prod-ping \/ ping/, 'it draws the everything-on ping against the bare ping')
  t.match(svg, /past saturation: prod-ping/, 'and the saturation curves')
})
