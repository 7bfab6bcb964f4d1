/**
 * `.ci/failures.sh`: what CI prints last when the suite fails, so the tail of
 * the log that CI keeps names every failure. Run on a real tap log: tap runs,
 * in a scratch project, a file with twelve failed assertions, one that hangs
 * past its own timeout, one that cannot import, one killed by a signal and one
 * with TODOs. The diagnostics are bounded; the list of failures, with the exit
 * code or signal of a file that died, and the timeout come last. A bail-out
 * and a run failed only by its coverage are read from short logs.
 */
import { spawnSync } from 'node:child_process'
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t, { type Test } from 'tap'
import { ROOT } from '../helpers/processes.js'

// tap's runner and five test processes; the hanging one gives up after its own 2 s.
t.setTimeout(90_000)

// Their sources are JavaScript in strings, template literals included.
/* eslint-disable no-template-curly-in-string */
const FILES: Record<string, string> = {
  'a-many.test.js': "import t from 'tap'\nt.test('twelve answers', async (t) => {\n  for (let i = 0; i < 12; i++) t.equal(429, 200, `answer ${i} is 200`)\n})\n",
  // Its own timeout: the run's (60 s) leaves the other files time to start on a busy machine.
  'b-hang.test.js': "import t from 'tap'\nt.setTimeout(2000)\nt.test('waits for an event that never comes', async () => { await new Promise(() => { setInterval(() => {}, 1000) }) })\n",
  'c-crash.test.js': "import './missing.js'\nimport t from 'tap'\nt.pass('never')\n",
  'd-killed.test.js': "import t from 'tap'\nt.pass('one')\nprocess.kill(process.pid, 'SIGKILL')\n",
  'e-todo.test.js': "import t from 'tap'\nt.todo('later')\nt.test('not yet', { todo: true }, async (t) => { t.fail('unfinished') })\nt.pass('fine')\n"
}

/** What failures.sh prints for `log`, line by line. */
function failures (t: Test, log: string): string[] {
  const dir = mkdtempSync(join(tmpdir(), 'ci-failures-log-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const file = join(dir, 'tap.log')
  writeFileSync(file, log)
  const printed = spawnSync('bash', [join(ROOT, '.ci', 'failures.sh'), file], { encoding: 'utf8' })
  t.equal(printed.status, 0, 'failures.sh exits 0: CI keeps its own status')
  return printed.stdout.trimEnd().split('\n')
}

t.test('every failure is named in the last lines, after bounded diagnostics', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'ci-failures-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'))
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'ci-failures', type: 'module', private: true }))
  // The repository's tap settings, its plugin list above all: with another list, tap would rebuild its
  // Test class inside the shared node_modules while the suite's other files import it.
  copyFileSync(join(ROOT, '.taprc'), join(dir, '.taprc'))
  mkdirSync(join(dir, 'test'))
  for (const [name, text] of Object.entries(FILES)) writeFileSync(join(dir, 'test', name), text)
  const built = join(ROOT, 'node_modules', '@tapjs', 'test', 'test-built', 'dist', 'esm', 'index.js')
  const builtAt = statSync(built).mtimeMs
  const tap = spawnSync(join(ROOT, 'node_modules', '.bin', 'tap'), ['--disable-coverage', ...Object.keys(FILES).map((f) => `test/${f}`)], { cwd: dir, encoding: 'utf8', timeout: 80_000, env: { PATH: process.env['PATH'] ?? '', HOME: process.env['HOME'] ?? dir } })
  t.not(tap.status, 0, 'the tap run failed')
  t.equal(statSync(built).mtimeMs, builtAt, 'and left the suite\'s own Test class as it was')

  const lines = failures(t, tap.stdout + tap.stderr)
  t.equal(lines[0], 'failed assertions:')
  t.match(lines.join('\n'), /not ok 1 - answer 0 is 200\n\s+---\n[^]*\n\s+-200\n\s+\+429\n/, 'the first failure with its diagnostics')
  const list = lines.indexOf('every failure, one line each:')
  t.ok(list > 0 && list <= 151, `diagnostics bounded (${list - 1} lines)`)
  const tail = lines.slice(list + 1)
  t.equal(tail.filter((l) => /^not ok \d+ - answer \d+ is 200$/.test(l)).length, 12, 'all twelve assertions are listed')
  t.ok(tail.some((l) => /^not ok \d+ - test\/a-many\.test\.js # time=\S+ \(exit code 1\)$/.test(l)), 'the failed file is listed')
  t.ok(tail.some((l) => /^not ok \d+ - test\/c-crash\.test\.js # time=\S+ \(exit code 1\)$/.test(l)), 'a file that cannot import, with its exit code')
  t.ok(tail.some((l) => /^not ok \d+ - test\/d-killed\.test\.js # time=\S+ \(killed by SIGKILL\)$/.test(l)), 'a file killed by a signal, with the signal')
  t.same(tail.filter((l) => /later|not yet|e-todo/.test(l)), [], 'TODOs are not failures')
  t.ok(tail.some((l) => /^not ok \d+ - timeout!$/.test(l)), 'the timeout is listed')
  t.ok(tail.includes('expired: test/b-hang.test.js'), 'and which file expired')
})

t.test('a bail-out is named; a run failed only by its coverage says so', async (t) => {
  const bailed = failures(t, 'TAP version 14\n# Subtest: test/x.test.js\n    ok 1 - first\n    Bail out! the store is gone\nBail out! the store is gone\n')
  t.same(bailed.slice(bailed.indexOf('every failure, one line each:') + 1), ['Bail out! the store is gone', 'Bail out! the store is gone'])
  const coverage = failures(t, 'ok 1 - test/x.test.js # time=5ms\n-----|\nAll files |   89.5 |   80 |   90 |   89.5 |\n# { total: 1, pass: 1 }\n')
  t.same(coverage.slice(coverage.indexOf('every failure, one line each:') + 1), [
    'no failed assertion in the log, yet tap failed: its coverage against the thresholds of .taprc:',
    'All files |   89.5 |   80 |   90 |   89.5 |'
  ])
})
