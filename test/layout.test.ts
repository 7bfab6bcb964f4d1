/**
 * The layout's one rule that code can break without a test noticing (issue 7):
 * the reference engine imports nothing of the gateway but src/shared/ and
 * schemas/, and shared/ imports nothing of either side.
 */
import { readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'
import t from 'tap'

const ROOT = path.resolve(import.meta.dirname, '..')
const IMPORT = /^\s*(?:import|export)\s[^'"]*?from\s+'(\.{1,2}\/[^']+)'/gm

/** Every relative import of the .ts files in `dir`, as paths relative to the repository root. */
function relativeImports (dir: string): Array<{ file: string, target: string }> {
  const found: Array<{ file: string, target: string }> = []
  for (const name of readdirSync(path.join(ROOT, dir)).filter((n) => n.endsWith('.ts'))) {
    const file = path.join(dir, name)
    for (const [, spec] of readFileSync(path.join(ROOT, file), 'utf8').matchAll(IMPORT)) {
      found.push({ file, target: path.relative(ROOT, path.resolve(ROOT, dir, spec!)) })
    }
  }
  return found
}

function outside (imports: Array<{ file: string, target: string }>, allowed: string[]): string[] {
  return imports.filter(({ target }) => !allowed.some((dir) => target.startsWith(dir + path.sep))).map(({ file, target }) => `${file} -> ${target}`)
}

t.test('the reference engine imports only src/reference-engine, src/shared and schemas', async (t) => {
  const imports = relativeImports('src/reference-engine')
  t.ok(imports.length > 10, 'its imports were found')
  t.same(outside(imports, ['src/reference-engine', 'src/shared', 'schemas']), [])
})

t.test('src/shared imports only src/shared and schemas', async (t) => {
  const imports = relativeImports('src/shared')
  t.ok(imports.length > 0, 'its imports were found')
  t.same(outside(imports, ['src/shared', 'schemas']), [])
})
