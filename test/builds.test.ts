/**
 * `npm run build` compiles what ships, src/ and schemas/, as the Dockerfile
 * does; the bench is a TypeScript project of its own (bench/tsconfig.json),
 * which `npm run bench` builds. Read from tsc's own file lists.
 */
import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { join, relative } from 'node:path'
import t from 'tap'
import { ROOT } from './helpers/processes.js'

const TSC = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc')
const scripts = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> }).scripts

/** The files of ours that `tsc -p project` compiles, relative to the root. */
function compiledBy (project: string): string[] {
  const out = execFileSync(process.execPath, [TSC, '-p', project, '--listFilesOnly'], { cwd: ROOT, encoding: 'utf8', timeout: 60_000 })
  return out.split('\n').filter((f) => f !== '' && !f.includes('/node_modules/')).map((f) => relative(ROOT, f))
}

t.test('npm run build compiles only src/ and schemas/', async (t) => {
  const project = /^tsc -p (\S+)$/.exec(scripts['build'] ?? '')?.[1]
  t.equal(project, 'tsconfig.build.json', 'npm run build is the product\'s project alone')
  const files = compiledBy(project ?? 'tsconfig.build.json')
  t.ok(files.includes('src/server.ts'), `${files.length} files`)
  t.same(files.filter((f) => !f.startsWith('src/') && !f.startsWith('schemas/')), [])
})

t.test('npm run bench builds the bench project, which the tests build too', async (t) => {
  t.match(scripts['bench'], /^tsc -p bench && node dist\/bench\/run\.js$/)
  t.match(scripts['build:tests'], /tsc -p bench/, 'the smoke runs of dist/bench/ find it built')
  t.ok(compiledBy('bench').includes('bench/run.ts'))
})
