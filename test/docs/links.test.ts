/**
 * The manual holds together: every relative link in README.md, CONTRIBUTING.md
 * and docs/**.md reaches a file of the repository (and, with a #fragment, a
 * heading of it), and every decision the code cites ("DECISIONS" followed by a
 * number, or a quoted title) has its record in docs/decisions/, so a reader of
 * a clone can follow each one.
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs'
import path from 'node:path'
import t from 'tap'
import { ROOT } from '../helpers/processes.js'

const DECISIONS_DIR = 'docs/decisions'

function filesUnder (dir: string, keep: (name: string) => boolean): string[] {
  if (!existsSync(path.join(ROOT, dir))) return []
  const found: string[] = []
  for (const entry of readdirSync(path.join(ROOT, dir), { withFileTypes: true })) {
    const rel = path.posix.join(dir, entry.name)
    if (entry.isDirectory()) found.push(...filesUnder(rel, keep))
    else if (keep(entry.name)) found.push(rel)
  }
  return found.sort()
}

/** Markdown without its fenced code blocks and inline code, where a bracket is not a link. */
function prose (markdown: string): string {
  return markdown.replace(/^(`{3,}|~{3,})[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '').replace(/`[^`\n]*`/g, '')
}

/** Inline links and images `[text](target "title")`, and reference definitions `[name]: target`. */
function linksOf (markdown: string): string[] {
  const text = prose(markdown)
  const inline = [...text.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)].map((m) => m[1]!)
  const references = [...text.matchAll(/^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$/gm)].map((m) => m[1]!)
  return [...inline, ...references]
}

/** GitHub's anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered. */
function anchorsOf (markdown: string): Set<string> {
  const anchors = new Set<string>()
  const seen = new Map<string, number>()
  for (const [, heading] of prose(markdown).matchAll(/^#{1,6}\s+(.+?)\s*#*\s*$/gm)) {
    const base = heading!
      .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, '')
      .replace(/\s/g, '-')
    const n = seen.get(base) ?? 0
    seen.set(base, n + 1)
    anchors.add(n === 0 ? base : `${base}-${n}`)
  }
  return anchors
}

interface Broken { link: string, why: string }

/** Each relative link of `file` that does not resolve inside the repository, and why. */
function brokenLinks (file: string): Broken[] {
  const markdown = readFileSync(path.join(ROOT, file), 'utf8')
  const broken: Broken[] = []
  for (const link of linksOf(markdown)) {
    if (/^[a-z][a-z0-9+.-]*:/i.test(link)) continue // http:, https:, mailto: are not this test's
    const [target = '', fragment] = link.split('#', 2) as [string, string | undefined]
    const resolved = target === '' ? path.join(ROOT, file) : path.resolve(ROOT, path.dirname(file), decodeURIComponent(target))
    const relative = path.relative(ROOT, resolved)
    if (relative.startsWith('..') || path.isAbsolute(relative)) {
      broken.push({ link, why: 'outside the repository' })
      continue
    }
    if (!existsSync(resolved)) {
      broken.push({ link, why: 'no such file' })
      continue
    }
    if (fragment === undefined || fragment === '') continue
    if (statSync(resolved).isDirectory() || !resolved.endsWith('.md')) {
      broken.push({ link, why: 'a #fragment on a file that is not markdown' })
      continue
    }
    if (!anchorsOf(readFileSync(resolved, 'utf8')).has(decodeURIComponent(fragment).toLowerCase())) broken.push({ link, why: `no heading #${fragment} in ${relative}` })
  }
  return broken
}

const MANUAL = [...['CONTRIBUTING.md'].filter((f) => existsSync(path.join(ROOT, f))), ...filesUnder('docs', (n) => n.endsWith('.md'))]

t.test('every relative link in docs/ and CONTRIBUTING.md resolves to a file and heading of the repository', async (t) => {
  t.ok(MANUAL.length >= 3, `${MANUAL.length} pages read`)
  for (const file of MANUAL) t.same(brokenLinks(file), [], file)
})

t.test('every relative link in README.md resolves, except those into ../shared', async (t) => {
  const broken = brokenLinks('README.md')
  // The README links to the spec and decisions in the workspace's shared folder, outside the repository: a known gap
  // until it links docs/ instead.
  const intoShared = broken.filter(({ link }) => link.startsWith('../shared/'))
  t.same(broken.filter((b) => !intoShared.includes(b)), [], 'README.md')
  t.test('README.md links nothing outside the repository', { todo: intoShared.length > 0 ? 'README.md still links to ../shared/' : false }, async (t) => {
    t.same(intoShared, [])
  })
})

t.test('the link check catches what it should', async (t) => {
  // A guard that cannot fail proves nothing: the same functions on known cases.
  t.same(linksOf('[a](x.md) `[b](y.md)` [c](z.md#part "t")\n```\n[d](w.md)\n```\n[e]: ./v.md\n'), ['x.md', 'z.md#part', './v.md'])
  t.same([...anchorsOf('# The contract, v1\n## Statuses & shapes\n## Statuses & shapes\n')], ['the-contract-v1', 'statuses--shapes', 'statuses--shapes-1'])
})

/** Every decision a file cites: numbers ("DECISIONS 24", "DECISIONS 11-12", "DECISIONS 10, 14-16 and 19") and titles
 * ("DECISIONS \"The upstream contract\"").
 */
export function citations (text: string): { numbers: number[], titles: string[] } {
  const numbers: number[] = []
  for (const [, list] of text.matchAll(/DECISIONS ((?:\d+(?:\s*[-–]\s*\d+)?)(?:(?:\s*,\s*|\s+and\s+)\d+(?:\s*[-–]\s*\d+)?)*)/g)) {
    for (const part of list!.split(/\s*,\s*|\s+and\s+/)) {
      const [from, to = from] = part.split(/\s*[-–]\s*/).map(Number) as [number, number?]
      for (let n = from; n <= to!; n++) numbers.push(n)
    }
  }
  const titles = [...text.matchAll(/DECISIONS "([^"]+)"/g)].map((m) => m[1]!)
  // The comments' form: "(decision: shared state)", "(decisions: identity; request ids)".
  for (const [, list] of text.matchAll(/\(decisions?: ([^)]+)\)/g)) titles.push(...list!.split(/\s*;\s*/))
  return { numbers, titles }
}

t.test('citations are read as the code writes them', async (t) => {
  t.same(citations('(DECISIONS 10, 14-16 and 19) DECISIONS 24-25: DECISIONS 21, DECISIONS "The upstream contract, v1"'), { numbers: [10, 14, 15, 16, 19, 24, 25, 21], titles: ['The upstream contract, v1'] })
  t.same(citations('x (decision: traces) y (decisions: identity; request ids)').titles, ['traces', 'identity', 'request ids'])
})

t.test('the product cites a decision by its title, never by its number alone', async (t) => {
  // "(decision: traces)" says what the record is about; "DECISIONS 29" makes the reader look it up.
  const numbered = ['src', 'schemas'].flatMap((dir) => filesUnder(dir, (n) => n.endsWith('.ts')))
    .flatMap((file) => readFileSync(path.join(ROOT, file), 'utf8').split('\n')
      .flatMap((line, i) => /DECISIONS \d/.test(line) ? [`${file}:${i + 1}: ${line.trim()}`] : []))
  t.same(numbered, [])
})

t.test('every decision cited in src/, schemas/, test/ and deploy/ has its record in docs/decisions/', async (t) => {
  const records = filesUnder(DECISIONS_DIR, (n) => n.endsWith('.md') && n !== 'README.md')
  const numbered = new Map(records.flatMap((f) => {
    const m = /^(\d{4})-/.exec(path.basename(f))
    return m === null ? [] : [[Number(m[1]), f] as const]
  }))
  // A title cited by its heading (without the record's number) or by the record's file name.
  const slug = (text: string): string => text.toLowerCase().replace(/[^a-z0-9 -]/g, '').trim().replace(/ +/g, '-')
  const titles = records.flatMap((f) => {
    const heading = /^# (?:\d+\. )?(.+)$/m.exec(readFileSync(path.join(ROOT, f), 'utf8'))?.[1] ?? ''
    return [heading.toLowerCase(), path.basename(f, '.md').replace(/^\d{4}-/, '')]
  })
  const missing: string[] = []
  let cited = 0
  const sources = ['src', 'schemas', 'test', 'deploy'].flatMap((dir) => filesUnder(dir, (n) => /\.(ts|ya?ml|json|cfg|conf|sh|md)$/.test(n))
    // This file quotes the citation forms to test the reader: it cites nothing.
    .filter((f) => f !== 'test/docs/links.test.ts'))
  for (const file of sources) {
    const found = citations(readFileSync(path.join(ROOT, file), 'utf8'))
    cited += found.numbers.length + found.titles.length
    for (const n of found.numbers) if (!numbered.has(n)) missing.push(`${file}: DECISIONS ${n}`)
    for (const title of found.titles) {
      const known = titles.some((t) => t.startsWith(title.toLowerCase()) || t.startsWith(slug(title)))
      if (!known) missing.push(`${file}: DECISIONS "${title}"`)
    }
  }
  t.ok(cited > 100, `${cited} citations read`)
  t.same([...new Set(missing)], [], 'citations without a record')
  const index = readFileSync(path.join(ROOT, DECISIONS_DIR, 'README.md'), 'utf8')
  t.same(records.filter((f) => !index.includes(`](${path.basename(f)})`)), [], 'every record is linked from docs/decisions/README.md')
})
