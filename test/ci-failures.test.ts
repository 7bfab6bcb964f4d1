/**
 * `.ci/failures.sh`: what CI prints last when the suite fails, so the tail of
 * the log that CI keeps names every failure. Run on a real tap log: tap runs
 * two files in a scratch project, one with twelve failed assertions, one
 * that hangs past its per-file timeout. The diagnostics are bounded; the list
 * of failures and the timeout come last, whatever came before.
 */
import { spawnSync } from 'node:child_process'
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { ROOT } from './helpers/processes.js'

// tap's runner, two test processes and a 2 s per-file timeout.
t.setTimeout(60_000)

t.test('every failure is named in the last lines, after bounded diagnostics', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'ci-failures-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'))
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'ci-failures', type: 'module', private: true }))
  // The repository's tap settings, its plugin list above all: with another list, tap would rebuild its
  // Test class inside the shared node_modules while the suite's other files import it.
  copyFileSync(join(ROOT, '.taprc'), join(dir, '.taprc'))
  mkdirSync(join(dir, 'test'))
  writeFileSync(join(dir, 'test', 'a-many.test.js'), "import t from 'tap'\nt.test('twelve answers', async (t) => {\n  for (let i = 0; i < 12; i++) t.equal(429, 200, `answer ${i} is 200`)\n})\n")
  writeFileSync(join(dir, 'test', 'b-hang.test.js'), "import t from 'tap'\nt.test('waits for an event that never comes', async () => { await new Promise(() => { setInterval(() => {}, 1000) }) })\n")
  const built = join(ROOT, 'node_modules', '@tapjs', 'test', 'test-built', 'dist', 'esm', 'index.js')
  const builtAt = statSync(built).mtimeMs
  const tap = spawnSync(join(ROOT, 'node_modules', '.bin', 'tap'), ['--disable-coverage', '--timeout=2', 'test/a-many.test.js', 'test/b-hang.test.js'], { cwd: dir, encoding: 'utf8', timeout: 50_000, env: { PATH: process.env['PATH'] ?? '', HOME: process.env['HOME'] ?? dir } })
  t.not(tap.status, 0, 'the tap run failed')
  t.equal(statSync(built).mtimeMs, builtAt, 'and left the suite\'s own Test class as it was')
  const log = join(dir, 'tap.log')
  writeFileSync(log, tap.stdout + tap.stderr)

  const printed = spawnSync('bash', [join(ROOT, '.ci', 'failures.sh'), log], { encoding: 'utf8' })
  t.equal(printed.status, 0)
  const lines = printed.stdout.trimEnd().split('\n')
  t.equal(lines[0], 'failed assertions:')
  t.match(printed.stdout, /not ok 1 - answer 0 is 200\n\s+---\n[^]*\n\s+-200\n\s+\+429\n/, 'the first failure with its diagnostics')
  const list = lines.indexOf('every failure, one line each:')
  t.ok(list > 0 && list <= 151, `diagnostics bounded (${list - 1} lines)`)
  const tail = lines.slice(list + 1)
  t.same(tail.filter((l) => /^not ok \d+ - answer \d+ is 200$/.test(l)).length, 12, 'all twelve assertions are listed')
  t.ok(tail.includes('not ok 1 - test/a-many.test.js # time=' + /# time=(\S+)/.exec(tail.find((l) => l.startsWith('not ok 1 - test/a-many.test.js'))!)![1]!), 'the failed file is listed')
  t.ok(tail.some((l) => /^not ok \d+ - timeout!$/.test(l)), 'the timeout is listed')
  t.equal(tail.at(-1), 'expired: test/b-hang.test.js', 'and which file expired, last')
})
