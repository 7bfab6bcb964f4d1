/**
 * Running a compiled bench script (dist/bench/*.js) from a smoke test: the
 * scripts are tooling, so they run with tap's coverage recorder off, in a
 * scratch folder, and only the shape of their JSON report is checked.
 */
import { execFile } from 'node:child_process'
import { existsSync } from 'node:fs'
import { mkdtemp, readFile, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'

import { ROOT } from './processes.js'

export { ROOT }
export const dist = (...parts: string[]): string => path.join(ROOT, 'dist', ...parts)

/** A tap `skip` value: false when every compiled file is there, else why not. */
export function skipUnlessBuilt (...files: string[]): false | string {
  const missing = files.find((file) => !existsSync(file))
  return missing === undefined ? false : `${missing} is missing: run \`npm run build\` first`
}

export const isCount = (v: unknown): boolean => typeof v === 'number' && Number.isInteger(v) && v >= 0
export const isFigure = (v: unknown): boolean => typeof v === 'number' && Number.isFinite(v) && v >= 0
export const isNumber = (v: unknown): boolean => typeof v === 'number' && Number.isFinite(v)

export interface BenchRun<T> {
  code: number | null
  stdout: string
  stderr: string
  report: T | undefined
}

/**
 * Run `script args... --json <tmp>` and parse the report. tap records
 * coverage in every process a test spawns; '0' switches its recorder off here
 * and in every process the script starts (inherited, not overridden), so
 * tooling does not count against the thresholds.
 */
export async function runBench<T> (
  t: { teardown: (fn: () => unknown) => void },
  script: string,
  args: string[],
  timeoutMs: number
): Promise<BenchRun<T>> {
  const dir = await mkdtemp(path.join(tmpdir(), 'bench-smoke-'))
  t.teardown(async () => await rm(dir, { recursive: true, force: true }))
  const out = path.join(dir, 'report.json')
  // METRICS_PORT=0: the harness starts several gateways at once, and each would take the default 9464.
  // RATE_LIMIT_PER_MINUTE=0: the smoke runs send thousands of requests with one token.
  const env = { ...process.env, _TAPJS_PROCESSINFO_COVERAGE_: '0', METRICS_PORT: '0', RATE_LIMIT_PER_MINUTE: '0' }
  const run = await new Promise<Omit<BenchRun<T>, 'report'>>((resolve) => {
    const child = execFile(
      process.execPath,
      [script, ...args, '--json', out],
      { cwd: ROOT, env, timeout: timeoutMs, maxBuffer: 16 * 1024 * 1024 },
      (_err, stdout, stderr) => resolve({ code: child.exitCode, stdout, stderr })
    )
  })
  const text = await readFile(out, 'utf8').catch(() => undefined)
  return { ...run, report: text === undefined ? undefined : (JSON.parse(text) as T) }
}
