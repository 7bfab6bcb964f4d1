/**
 * A one-second run of the load-test harness, so it cannot rot unnoticed. It
 * checks the shape of the JSON report only, never a figure: figures depend on
 * the machine, and this suite runs on shared, noisy ones.
 */
import { execFile } from 'node:child_process'
import { existsSync } from 'node:fs'
import { mkdtemp, readFile, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'

const root = fileURLToPath(new URL('..', import.meta.url))
const RUN = path.join(root, 'dist', 'bench', 'run.js')
const SERVER = path.join(root, 'dist', 'src', 'server.js')

// The report's contract: every scenario appears, run or skipped with a reason.
const SCENARIOS = ['direct', 'nginx', 'ping', 'update', 'create', 'create-10mib', 'ping-logging']
const RATIOS = ['gatewayPingVsNginx', 'gatewayPingP99VsNginx', 'gatewayPingVsDirect', 'updateVsPing', 'loggingVsNginx']

// Seven scenarios, each with a one-second warm-up and a one-second round, plus
// process start-up on a busy machine: well past tap's default per-file limit.
t.setTimeout(180_000)

const isCount = (v: unknown): boolean => typeof v === 'number' && Number.isInteger(v) && v >= 0
const isFigure = (v: unknown): boolean => typeof v === 'number' && Number.isFinite(v) && v >= 0

// The harness runs compiled code (dist/); without a build there is nothing to run.
const missing = [RUN, SERVER].find((file) => !existsSync(file))
const skip = missing === undefined ? false : `${missing} is missing: run \`npm run build\` first`

t.test('bench harness: one-second run writes a complete JSON report', { skip }, async (t) => {
  const dir = await mkdtemp(path.join(tmpdir(), 'bench-smoke-'))
  t.teardown(async () => await rm(dir, { recursive: true, force: true }))
  const out = path.join(dir, 'bench.json')
  // tap records coverage in every process a test spawns. The harness is
  // tooling, not product code, and would count against the thresholds with
  // branches (--target, failures) a smoke run never takes; the gateways it
  // starts are covered by their own tests. '0' switches tap's recorder off
  // here and in every process below (it is inherited and not overridden).
  const env = { ...process.env, _TAPJS_PROCESSINFO_COVERAGE_: '0' }
  const run = await new Promise<{ code: number | null, stdout: string, stderr: string }>((resolve) => {
    const child = execFile(process.execPath, [RUN, '--duration', '1', '--connections', '2', '--rounds', '1', '--json', out],
      { cwd: root, env, timeout: 170_000, maxBuffer: 16 * 1024 * 1024 },
      (_err, stdout, stderr) => resolve({ code: child.exitCode, stdout, stderr }))
  })
  t.equal(run.code, 0, run.code === 0 ? 'harness exits 0' : `harness exits 0, stderr:\n${run.stderr}`)
  const report = JSON.parse(await readFile(out, 'utf8')) as {
    machine: Record<string, unknown>
    options: Record<string, unknown>
    scenarios: Record<string, Record<string, unknown>>
    ratios: Record<string, Record<string, unknown>>
  }

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
