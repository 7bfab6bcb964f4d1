/**
 * `npm run build` compiles what ships, src/ and schemas/, as the Dockerfile
 * does; the bench is a TypeScript project of its own (bench/tsconfig.json),
 * which `npm run bench` builds. Read from each project's own file list; what
 * those files import stays inside src/ and schemas/ (test/project/layout.test.ts).
 */
import { readFileSync } from 'node:fs'
import { dirname, join, relative } from 'node:path'
import t from 'tap'
import ts from 'typescript'
import { ROOT } from '../helpers/processes.js'

const scripts = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> }).scripts

/** The files of ours that `tsc -p project` starts from, relative to the root. */
function compiledBy (project: string): string[] {
  const file = join(ROOT, project.endsWith('.json') ? project : join(project, 'tsconfig.json'))
  const { config } = ts.readConfigFile(file, ts.sys.readFile) as { config: unknown }
  const parsed = ts.parseJsonConfigFileContent(config, ts.sys, dirname(file), undefined, file)
  return parsed.fileNames.map((f) => relative(ROOT, f))
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
