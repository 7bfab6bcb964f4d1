/**
 * The write-first refusal tests are split by what refuses (REFUSAL_KINDS in test/helpers/refusals.ts), one file a
 * kind: every refusal has a kind, and every kind is run by exactly one file, the one named for it, so no refusal
 * is dropped or run twice when one is added.
 */
import { readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'
import t from 'tap'
import { EVERY_REFUSAL, REFUSAL_KINDS } from '../../helpers/refusals.js'
import { ROOT } from '../../helpers/processes.js'

const CALL = /writeFirstClientsReadEveryRefusal\(\s*t\s*,\s*'([^']*)'\s*\)/g

function testFiles (dir: string): string[] {
  return readdirSync(path.join(ROOT, dir), { withFileTypes: true }).flatMap((entry) => {
    const rel = path.posix.join(dir, entry.name)
    if (entry.isDirectory()) return testFiles(rel)
    return entry.name.endsWith('.test.ts') ? [rel] : []
  })
}

/** For each kind, the files that run it; and the file each should be, as problems in words. */
function splitProblems (sources: ReadonlyMap<string, string>, kinds: readonly string[]): string[] {
  const runBy = new Map<string, string[]>(kinds.map((kind) => [kind, []]))
  const problems: string[] = []
  for (const [file, text] of sources) {
    for (const [, kind] of text.matchAll(CALL)) {
      const files = runBy.get(kind!)
      if (files === undefined) problems.push(`${file} runs "${kind!}", no kind of REFUSAL_KINDS`)
      else files.push(file)
      if (path.posix.basename(file) !== `early-answers-refusals-${kind!}.test.ts`) {
        problems.push(`${file} runs "${kind!}" but is not named early-answers-refusals-${kind!}.test.ts`)
      }
    }
  }
  for (const [kind, files] of runBy) {
    if (files.length !== 1) problems.push(`kind "${kind}" run by ${files.length} files: ${files.join(', ')}`)
  }
  return problems
}

t.test('every refusal has a kind, and every kind is run by exactly one file named for it', async (t) => {
  t.same(EVERY_REFUSAL.filter((r) => !REFUSAL_KINDS.includes(r.kind)).map((r) => r.name), [], 'refusals without a kind')
  t.same(REFUSAL_KINDS.filter((kind) => !EVERY_REFUSAL.some((r) => r.kind === kind)), [], 'kinds without a refusal')
  t.ok(EVERY_REFUSAL.length >= 13, `${EVERY_REFUSAL.length} refusals (13 ran before the split by kind)`)
  // This file quotes the call in its self-check below: it runs no refusal.
  const files = testFiles('test').filter((file) => file !== 'test/routes/create/early-answers-refusals-split.test.ts')
  const sources = new Map(files.map((file) => [file, readFileSync(path.join(ROOT, file), 'utf8')]))
  t.same(splitProblems(sources, REFUSAL_KINDS), [])
})

t.test('the split check finds a kind run twice, one run by no file, and a file misnamed', async (t) => {
  const sources = new Map([
    ['test/a/early-answers-refusals-form.test.ts', "writeFirstClientsReadEveryRefusal(t, 'form')"],
    ['test/b/other.test.ts', "writeFirstClientsReadEveryRefusal(t, 'form')"]
  ])
  t.same(splitProblems(sources, ['form', 'size']), [
    'test/b/other.test.ts runs "form" but is not named early-answers-refusals-form.test.ts',
    'kind "form" run by 2 files: test/a/early-answers-refusals-form.test.ts, test/b/other.test.ts',
    'kind "size" run by 0 files: '
  ])
})
