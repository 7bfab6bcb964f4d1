/**
 * A short run of the load-test harness, so it cannot rot unnoticed: every
 * scenario for half a second with no warm-up (a quarter left the capacity
 * search's first step 97.4% answered against its 97% rule beside a busy
 * neighbour: too near), the open loop past saturation, two steps of the
 * capacity search, the latency pair, the charts
 * and the cost table's markdown (written from the run's report: --markdown
 * itself refuses fewer than 3 rounds). It checks the shape of the JSON
 * report and that every answer was the one expected (2xx; past saturation
 * also 503/429), never a figure: figures depend on the machine, and this
 * suite runs on shared, noisy ones.
 *
 * The scenario list is read from the compiled harness, so adding a scenario
 * is one entry in bench/scenarios.ts; the names below must always be there.
 */
import { readFile, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import t from 'tap'
import { dist, isCount, isFigure, isNumber, runBench, skipUnlessBuilt } from '../helpers/bench.js'
import { capacityOf, isSustained, writeMarkdown, type MarkdownInput } from '../../bench/costs.js'
import { roundSchedule } from '../../bench/schedule.js'

const RUN = dist('bench', 'run.js')
const SCENARIO_MODULE = dist('bench', 'scenarios.js')

// The report's contract: these scenarios always exist, and each appears, run or skipped with a reason.
const REQUIRED = [
  'direct',
  'nginx',
  'bare-ping',
  'bare-update',
  'ping',
  'update',
  'create',
  'create-10mib',
  'ping-logging',
  'ping-jwks',
  'ping-ratelimit',
  'ping-redis',
  'ping-redis-cluster',
  'ping-redis-users',
  'ping-metrics',
  'ping-traceparent',
  'ping-shedding',
  'update-idempotent',
  'prod-ping',
  'prod-update',
  'prod-create',
  'prod-redis-ping',
  'prod-redis-update',
  'prod-redis-create',
  'ping-2-engines'
]
// The cost table's rows (docs/performance.md): the baseline, the bare gateway, each feature, everything on.
const COST_ROWS = [
  'bare-ping',
  'ping',
  'update',
  'ping-logging',
  'ping-metrics',
  'ping-ratelimit',
  'ping-redis',
  'ping-traceparent',
  'ping-shedding',
  'ping-2-engines',
  'ping-jwks',
  'update-idempotent',
  'prod-ping'
]
const RATIOS = [
  'gatewayPingVsNginx',
  'gatewayPingP99VsNginx',
  'gatewayPingVsDirect',
  'updateVsPing',
  'loggingVsNginx',
  'loggingVsPing',
  'keySetVsHs256Ping',
  'rateLimitVsPing',
  'redisLimitVsPing',
  'redisClusterLimitVsPing',
  'redisLimitUsersVsPing',
  'idempotentVsUpdate',
  'metricsVsPing',
  'traceparentVsPing',
  'twoEnginesVsPing',
  'prodPingVsNginx',
  'prodPingVsPing',
  'prodUpdateVsUpdate',
  'prodCreateVsCreate',
  'prodRedisPingVsNginx',
  'prodRedisPingVsProdPing'
]
/** The features a scenario may be skipped for, while they are not on this branch. */
const FEATURES = ['jwks', 'rate-limit', 'redis', 'redis-cluster', 'idempotency', 'metrics', 'shedding', 'traceparent']

// Twenty-eight scenarios of half a second, four open-loop steps, two search steps, four latency steps, and
// thirteen gateways and a three-node cluster to start on a busy machine.
t.setTimeout(240_000)

// The harness runs compiled code (dist/); without a build there is nothing to run.
const skip = skipUnlessBuilt(RUN, dist('src', 'server.js'))

t.test('bench harness: a half-second run writes a complete JSON report and a chart', { skip }, async (t) => {
  const { SCENARIOS: declared } = (await import(SCENARIO_MODULE)) as {
    SCENARIOS: Array<{ name: string; cost?: unknown }>
  }
  const SCENARIOS = declared.map((s) => s.name)
  t.same(
    REQUIRED.filter((name) => !SCENARIOS.includes(name)),
    [],
    'the required scenarios are declared'
  )
  t.same(
    COST_ROWS.filter((name) => !declared.some((s) => s.name === name && s.cost !== undefined)),
    [],
    'the cost rows are declared'
  )
  const chart = path.join(tmpdir(), `bench-smoke-chart-${process.pid}.svg`)
  const costChart = path.join(tmpdir(), `bench-smoke-cost-${process.pid}.svg`)
  const markdown = path.join(tmpdir(), `bench-smoke-cost-${process.pid}.md`)
  await writeFile(markdown, '# Kept above\n\n<!-- bench:begin -->\nold table\n<!-- bench:end -->\n\nKept below\n')
  t.teardown(async () => await Promise.all([chart, costChart, markdown].map(async (f) => await rm(f, { force: true }))))
  const run = await runBench<{
    machine: Record<string, unknown>
    options: Record<string, unknown>
    features: Record<string, string>
    scenarios: Record<string, Record<string, unknown>>
    ratios: Record<string, Record<string, unknown>>
    saturation: {
      scenario: string
      capacityRps: number
      points: Array<Record<string, unknown>>
      verdict: Record<string, unknown>
    } | null
    costs: MarkdownInput['costs']
    schedule: {
      rowsPerBase: number
      order: string[]
      rounds: Array<Array<{ scenario: string; usPerRequest: number | null }>>
    }
    settled: Record<string, number>
    latency: {
      capacityFrom: string
      capacityRps: number
      closedLoopRps: number
      capacityBounded: boolean
      capacitySteps: Array<Record<string, unknown>>
      baseline: string
      points: Array<Record<string, unknown>>
      verdict: Record<string, unknown>
    } | null
  }>(
    t,
    RUN,
    [
      '--duration',
      '0.5',
      '--connections',
      '2',
      '--rounds',
      '1',
      '--warmup',
      '0',
      '--settle',
      '0.3',
      '--saturation-connections',
      '8',
      '--capacity-steps',
      '2',
      // The shedding gateways (ping-shedding, prod-*) shed at 5 s of event-loop delay, not 200 ms: their shedding
      // code runs, but one 200 ms stall of a gateway process on a busy machine no longer answers the load a 503,
      // which the every-answer-2xx check below would count against the harness.
      '--shed-delay-ms',
      '5000',
      '--chart',
      chart,
      '--cost-chart',
      costChart
    ],
    230_000
  )
  t.equal(run.code, 0, run.code === 0 ? 'harness exits 0' : `harness exits 0, stderr:\n${run.stderr}`)
  const report = run.report!

  t.ok(isCount(report.machine.cpus), 'machine.cpus')
  t.equal(typeof report.machine.node, 'string', 'machine.node')
  t.ok(!Number.isNaN(Date.parse(String(report.machine.date))), 'machine.date')
  t.match(
    report.options,
    {
      duration: 0.5,
      connections: 2,
      rounds: 1,
      rowsPerBase: 2,
      warmup: 0,
      settle: 0.3,
      saturationConnections: 8,
      capacitySteps: 2,
      shedDelayMs: 5000
    },
    'options echo the command line'
  )
  // Settled once before round 1: every server process the same 0.3 s in all, split among its scenarios,
  // as autocannon timed it (0.3 s per scenario would give the gateway behind six of them 1.8 s).
  const settledNames = [...run.stderr.matchAll(/^settling (\S+) on (\S+) \(/gm)].map(([, name]) => name!)
  t.ok(
    settledNames.includes('bare-ping') && settledNames.includes('ping'),
    'the bare proxy and the gateways are settled'
  )
  t.same(
    settledNames.filter((name) => report.scenarios[name] === undefined),
    [],
    'only scenarios of the run are settled'
  )
  t.ok(Object.keys(report.settled).length >= 3, 'settled: seconds per process')
  t.same(
    Object.entries(report.settled).filter(([, seconds]) => seconds < 0.29 || seconds > 0.55),
    [],
    'each process about 0.3 s in all, however many scenarios it serves'
  )
  const missing = Object.keys(report.features)
  t.same(
    missing.filter((f) => !FEATURES.includes(f)),
    [],
    'features: only known ones reported missing'
  )

  t.same(Object.keys(report.scenarios).sort(), [...SCENARIOS].sort(), 'every scenario is in the report')
  for (const name of SCENARIOS) {
    const s = report.scenarios[name]!
    if (s.skipped !== undefined) {
      // nginx may be absent (not installed); a feature scenario only while its feature is not in the build.
      const reason = String(s.skipped)
      const allowed = name === 'nginx' ? /not installed/.test(reason) : missing.some((f) => reason.startsWith(`${f}: `))
      t.ok(allowed, `${name} skipped: ${reason}`)
      t.notOk(
        name === 'prod-ping' || name === 'prod-update' || name === 'prod-create' || name.startsWith('bare-'),
        `${name}: the production profile and the bare proxy always run`
      )
      continue
    }
    for (const field of ['rps', 'p50', 'p99']) t.ok(isFigure(s[field]), `${name}.${field} is a number`)
    for (const field of ['non2xx', 'errors']) t.ok(isCount(s[field]), `${name}.${field} is a count`)
    // Not a figure but correctness: a gateway answering 401, 429 or 502 to the load must fail here.
    t.equal(
      s.non2xx,
      0,
      `${name}: every answer was 2xx${s.non2xx === 0 ? '' : `: ${JSON.stringify(s.statusCodes)} ${JSON.stringify(s.probe)}`}`
    )
    t.equal(s.errors, 0, `${name}: no connection errors`)
    t.ok(Array.isArray(s.rounds) && s.rounds.length === 1, `${name}: one round`)
    const round = (s.rounds as Array<Record<string, unknown>>)[0]
    t.ok(
      round !== undefined && isFigure(round.rps) && isFigure(round.p99) && isCount(round.non2xx),
      `${name}: round figures`
    )
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
  t.same(
    sat?.points.map((p) => p.multiple),
    [0.5, 1, 1.5, 2],
    'offered at 0.5, 1, 1.5 and 2 x capacity'
  )
  for (const p of sat?.points ?? []) {
    const label = `${String(p.multiple)}x`
    t.equal(p.offeredRps, Math.max(1, Math.round(sat!.capacityRps * Number(p.multiple))), `${label}: offered rate`)
    for (const field of ['goodputRps', 'answeredRps']) t.ok(isCount(p[field]), `${label}.${field}`)
    t.ok(isFigure(p.p99Accepted), `${label}: p99 of accepted`)
    for (const field of ['shedShare', 'limitedShare']) { t.ok(isFigure(p[field]) && Number(p[field]) <= 1, `${label}.${field} is a share`) }
    t.equal(p.otherNon2xx, 0, `${label}: every refusal was a 503 or a 429: ${JSON.stringify(p.statusCodes)}`)
    t.equal(p.errors, 0, `${label}: no connection errors`)
    t.ok(isCount(p.notSent), `${label}: notSent`)
  }
  t.equal(typeof sat?.verdict.goal, 'string', 'saturation verdict')

  // The cost table: one row per declared cost scenario, each a ratio to the bare proxy from the same run.
  t.equal(report.costs.baseline, 'bare-ping', 'costs against the bare proxy')
  t.same(
    report.costs.rows.map((r) => r.scenario),
    declared.filter((s) => s.cost !== undefined).map((s) => s.name),
    'a row per cost scenario, in order'
  )
  for (const row of report.costs.rows) {
    const name = String(row.scenario)
    t.equal(typeof row.feature, 'string', `${name}: feature`)
    t.ok(row.base === 'bare-ping' || row.base === 'bare-update', `${name}: base is a bare-proxy scenario`)
    if (row.skipped !== undefined) {
      t.ok(
        missing.some((f) => String(row.skipped).startsWith(`${f}: `)),
        `${name} skipped: ${String(row.skipped)}`
      )
      continue
    }
    t.ok(isFigure(row.ratio) && isFigure(row.cpuUsPerRequest), `${name}: ratio and CPU per request`)
    t.ok(row.adds === null ? row.share === null : row.share === null || isNumber(row.share), `${name}: share`)
    t.equal(row.rounds, 1, `${name}: one round`)
    t.ok(row.met === null || typeof row.met === 'boolean', `${name}: met`)
  }
  t.equal(report.costs.rows.find((r) => r.scenario === 'bare-ping')?.ratio, 1, 'the baseline is 1')

  // The round's order: every run scenario, each cost row next to a measurement of its base.
  const ran = SCENARIOS.filter((name) => report.scenarios[name]!.skipped === undefined)
  t.same(
    report.schedule.order,
    roundSchedule(declared.filter((s) => ran.includes(s.name)) as never, 2),
    "the round ran in the schedule's order"
  )
  t.same([...new Set(report.schedule.order)].sort(), [...ran].sort(), 'every scenario that ran is in it')
  t.same(
    report.schedule.rounds.map((round) => round.map((m) => m.scenario)),
    [report.schedule.order],
    'one round, measured in that order'
  )
  for (const row of report.costs.rows) {
    if (row.skipped !== undefined || row.scenario === row.base) continue
    const at = report.schedule.order.indexOf(row.scenario)
    t.ok(
      report.schedule.order[at - 1] === row.base || report.schedule.order[at + 1] === row.base,
      `${row.scenario}: measured next to ${row.base}`
    )
  }

  // Latency for phones: the bare proxy and everything on, at 0.5 and 0.9 of the everything-on capacity.
  const latency = report.latency
  t.ok(latency !== null && 'points' in latency, 'the latency pair ran')
  t.match(latency, { capacityFrom: 'prod-ping', baseline: 'bare-ping', capacityRps: Number })
  t.ok(
    isCount(latency?.capacityRps) && latency!.capacityRps > 0 && isCount(latency?.closedLoopRps),
    "capacity measured in the open loop, beside the closed loop's rate"
  )
  t.equal(typeof latency?.capacityBounded, 'boolean', 'whether the search found a step that failed')
  const steps = latency?.capacitySteps ?? []
  t.ok(steps.length >= 1 && steps.length <= 2, 'the capacity search ran, at most --capacity-steps steps')
  for (const [i, step] of steps.entries()) {
    t.match(
      step,
      {
        offeredRps: Number,
        goodputRps: Number,
        non2xx: Number,
        errors: Number,
        p99: Number,
        cpu: { server: Number, generator: Number },
        sustained: Boolean
      },
      `search step ${i}: its shape`
    )
    t.equal(step.sustained, isSustained(step as never), `search step ${i}: sustained as the rule says`)
  }
  t.equal(latency?.capacityRps, capacityOf(steps as never).rps, 'the capacity is the last sustained step of the search')
  t.same(
    latency?.points.map((p) => `${String(p.scenario)}@${String(p.multiple)}`),
    ['bare-ping@0.5', 'prod-ping@0.5', 'bare-ping@0.9', 'prod-ping@0.9']
  )
  for (const p of latency?.points ?? []) {
    const label = `${String(p.scenario)} at ${String(p.multiple)}x`
    t.ok(isFigure(p.p50) && isFigure(p.p99) && isCount(p.offeredRps), `${label}: p50, p99, offered`)
    t.equal(p.non2xx, 0, `${label}: every answer 2xx`)
    t.equal(p.errors, 0, `${label}: no errors`)
  }
  t.equal(typeof latency?.verdict.goal, 'string', 'latency verdict')

  await writeMarkdown(markdown, {
    machine: report.machine as MarkdownInput['machine'],
    command: 'npm run bench -- (smoke)',
    rounds: 1,
    rowsPerBase: 2,
    costs: report.costs,
    latency: report.latency as MarkdownInput['latency']
  })
  const doc = await readFile(markdown, 'utf8')
  t.match(doc, /^# Kept above\n\n<!-- bench:begin /, 'the text above the table is kept')
  t.match(doc, /\n<!-- bench:end -->\n\nKept below\n$/, 'and the text below')
  t.notMatch(doc, /old table/, 'the old table is replaced')
  t.match(doc, /\| `bare-ping` \| .* \| 1\.00 \|/, 'the table has the baseline row')
  t.match(doc, /### Latency for phones/, 'and the latency table')
  t.match(doc, /from a single round \(not a median/, 'the text says how many rounds the figures are of')
  t.match(
    await readFile(costChart, 'utf8'),
    /^<svg xmlns="http:\/\/www.w3.org\/2000\/svg"[^]*bare-ping/,
    'the cost chart is an SVG with the rows'
  )

  const svg = await readFile(chart, 'utf8')
  t.match(svg, /^<svg xmlns="http:\/\/www.w3.org\/2000\/svg"/, 'the chart is an SVG document')
  t.match(svg, /prod-ping \/ ping/, 'it draws the everything-on ping against the bare ping')
  t.match(svg, /past saturation: prod-ping/, 'and the saturation curves')
})
