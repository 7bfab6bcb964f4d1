/**
 * The engine client only looks down (STYLE: each folder only looks down): it
 * imports nothing of limits/, routes/, auth/ or the app, and its own files
 * import each other without a cycle (types.ts holds what they share).
 */
import { readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'
import t from 'tap'
import { ROOT } from '../helpers/processes.js'

const DIR = path.join(ROOT, 'src', 'engine-client')
const IMPORT = /^\s*(?:import|export)\s[^'"]*?from\s+'(\.{1,2}\/[^']+)'/gm

const files = readdirSync(DIR).filter((n) => n.endsWith('.ts'))
const importsOf = (name: string): string[] => [...readFileSync(path.join(DIR, name), 'utf8').matchAll(IMPORT)].map(([, spec]) => path.relative(DIR, path.resolve(DIR, spec!)))

t.test('src/engine-client imports nothing from the layers above it', async (t) => {
  const upward = files.flatMap((f) => importsOf(f).filter((target) => /^\.\.\/(limits|routes|auth|app|server)\b/.test(target)).map((target) => `${f} -> ${target}`))
  t.ok(files.length >= 9, 'its files were found')
  t.same(upward, [])
})

t.test('no import cycle among the engine client\'s files', async (t) => {
  const graph = new Map(files.map((f) => [f.replace(/\.ts$/, ''), importsOf(f).filter((target) => !target.startsWith('..')).map((target) => target.replace(/\.js$/, ''))]))
  const cycles: string[] = []
  const visit = (node: string, trail: string[]): void => {
    if (trail.includes(node)) {
      cycles.push([...trail.slice(trail.indexOf(node)), node].join(' -> '))
      return
    }
    for (const next of graph.get(node) ?? []) visit(next, [...trail, node])
  }
  for (const node of graph.keys()) visit(node, [])
  t.same([...new Set(cycles)], [])
})
