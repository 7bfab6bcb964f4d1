/**
 * docs/architecture.md's tree of src/ is written by hand (a line of why for each part) but held to the code: it
 * names every file of src/, each once under its own folder's entry (or as its own entry), every folder of src/
 * has an entry, and no name or path in it, nor in the request path's picture, is gone from the repository.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'
import t from 'tap'
import { ROOT } from '../helpers/processes.js'

const DOC = 'docs/architecture.md'

/** The first fenced block after `heading`, as its lines. */
function blockAfter (markdown: string, heading: string): string[] {
  const at = markdown.indexOf(`\n${heading}\n`)
  if (at < 0) throw new Error(`${DOC} has no heading "${heading}"`)
  const block = /\n```[^\n]*\n([\s\S]*?)\n```/.exec(markdown.slice(at))
  if (block === null) throw new Error(`${DOC} has no code block after "${heading}"`)
  return block[1]!.split('\n')
}

interface Entry { path: string, text: string }

/** An entry starts at column 0 with its path; lines that start with spaces continue the entry above. */
function entriesOf (lines: readonly string[]): Entry[] {
  const entries: Entry[] = []
  for (const line of lines) {
    const head = /^(\S+)\s*(.*)$/.exec(line)
    if (head !== null) entries.push({ path: head[1]!, text: head[2]! })
    else if (entries.length > 0 && line.trim() !== '') entries.at(-1)!.text += ' ' + line.trim()
  }
  return entries
}

/** Repository paths quoted in `text` (src/x.ts, schemas/env.ts, deploy/...), with a folder and an extension. */
const pathsIn = (text: string): string[] =>
  [...text.matchAll(/(?<![\w./-])((?:src|schemas|test|deploy|bench|fixtures|client|docs)\/[\w./-]*\w\.\w+)/g)].map((m) => m[1]!)

/** The files of src/ an entry names: itself when it is a file, else the bare `name.ts` in its text, of its folder. */
function filesNamed (entry: Entry): string[] {
  if (!entry.path.startsWith('src/')) return []
  if (!entry.path.endsWith('/')) return [entry.path]
  const bare = [...entry.text.matchAll(/(?<![\w./-])([\w-]+\.ts)\b/g)].map((m) => m[1]!)
  return bare.map((name) => entry.path + name)
}

/** What the tree gets wrong against `srcFiles`, in words. */
function treeProblems (
  entries: readonly Entry[], srcFiles: readonly string[], exists: (p: string) => boolean
): string[] {
  const problems: string[] = []
  const named = entries.flatMap(filesNamed)
  for (const file of new Set(named)) {
    const times = named.filter((n) => n === file).length
    if (!srcFiles.includes(file)) problems.push(`${file}: named in the tree, not a file of src/`)
    else if (times > 1) problems.push(`${file}: named ${times} times`)
  }
  for (const file of srcFiles) if (!named.includes(file)) problems.push(`${file}: not in the tree`)
  const folders = new Set(srcFiles.map((f) => path.posix.dirname(f) + '/').filter((d) => d !== 'src/'))
  for (const folder of folders) if (!entries.some((e) => e.path === folder)) problems.push(`${folder}: no entry`)
  for (const entry of entries) {
    if (!exists(entry.path)) problems.push(`${entry.path}: the entry names nothing in the repository`)
    for (const quoted of pathsIn(entry.text)) if (!exists(quoted)) problems.push(`${entry.path}: ${quoted} is gone`)
  }
  return problems
}

function srcFiles (dir: string): string[] {
  return readdirSync(path.join(ROOT, dir), { withFileTypes: true }).flatMap((entry) => {
    const rel = path.posix.join(dir, entry.name)
    return entry.isDirectory() ? srcFiles(rel) : entry.name.endsWith('.ts') ? [rel] : []
  }).sort()
}

const inRepository = (p: string): boolean => existsSync(path.join(ROOT, p))
const markdown = readFileSync(path.join(ROOT, DOC), 'utf8')

t.test('the tree names every file and folder of src/, once, and nothing that is gone', async (t) => {
  const entries = entriesOf(blockAfter(markdown, '## The tree'))
  t.ok(entries.length > 20, `${entries.length} entries read`)
  t.same(treeProblems(entries, srcFiles('src'), inRepository), [])
})

t.test('every file the request path\'s picture names is there', async (t) => {
  const quoted = blockAfter(markdown, '## The request path').flatMap(pathsIn)
  t.ok(quoted.length > 2, `${quoted.join(', ')} quoted`)
  t.same(quoted.filter((p) => !inRepository(p)), [], 'gone')
})

t.test('the tree check finds a file left out, one named twice, a stale name and a folder without an entry', async (t) => {
  const entries = entriesOf([
    'src/app.ts                buildApp (schema: schemas/gone.ts)',
    'src/http/                 front.ts, errors.ts,',
    '                          front.ts, stale.ts',
    'docs/                     this manual'
  ])
  const files = ['src/app.ts', 'src/http/errors.ts', 'src/http/front.ts', 'src/http/new.ts', 'src/auth/jwt.ts']
  const exists = (p: string): boolean => p !== 'schemas/gone.ts'
  t.same(treeProblems(entries, files, exists), [
    'src/http/front.ts: named 2 times',
    'src/http/stale.ts: named in the tree, not a file of src/',
    'src/http/new.ts: not in the tree',
    'src/auth/jwt.ts: not in the tree',
    'src/auth/: no entry',
    'src/app.ts: schemas/gone.ts is gone'
  ])
})
