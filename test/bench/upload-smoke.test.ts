/**
 * A minimal run of the upload benchmark (bench/upload.ts), so it cannot rot
 * unnoticed. It checks the shape of the JSON report only, never a figure:
 * figures depend on the machine, and this suite runs on shared, noisy ones.
 */
import { existsSync } from 'node:fs'
import t from 'tap'
import { dist, isCount, isNumber, runBench, skipUnlessBuilt } from '../helpers/bench.js'

const UPLOAD = dist('bench', 'upload.js')
// nginx in front of the engine is the upload anchor; without the binary its figures are null.
const NGINX = existsSync('/usr/sbin/nginx')

// Two child processes to start, a few 1-10 MiB uploads: seconds, but on a busy machine it may be many.
t.setTimeout(120_000)

// The benchmark runs compiled code (dist/); without a build there is nothing to run.
const skip = skipUnlessBuilt(UPLOAD, dist('src', 'server.js'), dist('src', 'reference-engine', 'standalone.js'))

t.test('upload bench: a minimal run writes a complete JSON report', { skip }, async (t) => {
  const run = await runBench<{
    machine: Record<string, unknown>
    options: Record<string, unknown>
    uploadTime: Array<Record<string, unknown>>
    memory: {
      goal: unknown
      gatewayGrowthMb: unknown
      met: unknown
      atReady?: { gatewayMb?: unknown; engineMb?: unknown }
      gatewayHwmOverReadyMb: unknown
      phases: Array<Record<string, unknown>>
    }
  }>(t, UPLOAD, ['--rounds', '1', '--uploads', '1', '--warmup', '0', '--concurrency', '2', '--waves', '1'], 110_000)
  t.equal(run.code, 0, run.code === 0 ? 'bench exits 0' : `bench exits 0, stderr:\n${run.stderr}`)
  const report = run.report!

  t.ok(isCount(report.machine.cpus), 'machine.cpus')
  t.equal(typeof report.machine.node, 'string', 'machine.node')
  t.ok(!Number.isNaN(Date.parse(String(report.machine.date))), 'machine.date')
  t.match(
    report.options,
    { rounds: 1, uploads: 1, warmup: 0, concurrency: 2, waves: 1 },
    'options echo the command line'
  )

  t.same(
    report.uploadTime.map((s) => s.label),
    ['1 MiB', '10 MiB'],
    'both sizes are timed'
  )
  for (const size of report.uploadTime) {
    const label = String(size.label)
    t.ok(isCount(size.bytes), `${label}: bytes`)
    for (const target of NGINX ? ['direct', 'nginx', 'gateway'] : ['direct', 'gateway']) {
      const side = size[target] as { medianMs: unknown; rounds: Array<Record<string, unknown>> }
      t.ok(
        side !== undefined && Array.isArray(side.rounds) && side.rounds.length === 1,
        `${label} ${target}: one round`
      )
      t.ok(side.medianMs === null || typeof side.medianMs === 'number', `${label} ${target}: medianMs`)
      t.ok(isCount(side.rounds[0]?.uploads) && isCount(side.rounds[0]?.failures), `${label} ${target}: round counts`)
    }
    t.ok(size.ratio === null || typeof size.ratio === 'number', `${label}: ratio`)
    t.ok(Array.isArray(size.roundRatios), `${label}: roundRatios`)
    if (NGINX) {
      t.ok(typeof size.nginxRatio === 'number' && Number.isFinite(size.nginxRatio), `${label}: gateway/nginx ratio`)
      t.equal(size.nginxMet === null, label !== '10 MiB', `${label}: gateway/nginx judged at 10 MiB only`)
    } else {
      t.equal(size.nginx, null, `${label}: no nginx figures without nginx`)
    }
    t.equal(typeof size.goal, 'string', `${label}: goal`)
    t.equal(typeof size.met, 'boolean', `${label}: met`)
    t.equal(size.failures, 0, `${label}: every upload answered 200 with a portfolio_id`)
  }

  t.equal(typeof report.memory.goal, 'string', 'memory.goal')
  t.equal(typeof report.memory.met, 'boolean', 'memory.met')
  t.ok(
    report.memory.gatewayGrowthMb === null || typeof report.memory.gatewayGrowthMb === 'number',
    'memory.gatewayGrowthMb'
  )
  t.ok(isNumber(report.memory.atReady?.gatewayMb) && isNumber(report.memory.atReady?.engineMb), 'memory.atReady')
  t.ok(
    report.memory.gatewayHwmOverReadyMb === null || typeof report.memory.gatewayHwmOverReadyMb === 'number',
    'memory.gatewayHwmOverReadyMb'
  )
  t.same(
    report.memory.phases.map((p) => p.via),
    ['gateway', 'direct'],
    'memory phases: through the gateway, then straight to the engine'
  )
  for (const phase of report.memory.phases) {
    const via = String(phase.via)
    t.match(phase, { concurrency: 2, waves: 1 }, `${via}: phase options`)
    t.ok(isCount(phase.failures) && isCount(phase.uploads), `${via}: counts`)
    t.equal(phase.failures, 0, `${via}: no failed upload`)
    t.ok(Array.isArray(phase.waveMs) && (phase.waveMs as unknown[]).length === 1, `${via}: one wave`)
    const processes = phase.processes as Array<Record<string, unknown>>
    t.same(
      processes.map((p) => p.process),
      via === 'gateway' ? ['gateway', 'engine'] : ['engine'],
      `${via}: processes watched`
    )
    for (const p of processes) {
      for (const field of ['baselineMb', 'peakMb', 'growthMb', 'hwmBeforeMb', 'hwmAfterMb']) {
        t.ok(p[field] === null || isNumber(p[field]), `${via} ${String(p.process)}.${field}`)
      }
      t.ok(isCount(p.samples), `${via} ${String(p.process)}.samples`)
    }
  }
})
