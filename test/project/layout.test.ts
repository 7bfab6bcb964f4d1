/**
 * The layout's rules, which code can break without any other test noticing:
 * each folder of src/ only looks down, no two files of src/ import each other
 * (directly or round a loop), and the reference engine imports nothing of the
 * gateway but src/shared/ and schemas/. The layer order is written down once,
 * in LAYERS below; CONTRIBUTING.md points here. And the tests' own layout:
 * test/ mirrors src/, so a source file's tests are where its path says.
 *
 * Imports are read with TypeScript's own parser: every static `import` and
 * `export ... from`, type-only ones included (a type is a dependency too, and
 * a cycle of types is still a knot for the reader).
 */
import { readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'
import t from 'tap'
import ts from 'typescript'
import { ROOT } from '../helpers/processes.js'

/**
 * The layers, bottom first. A file may import files of its own layer and of
 * any layer below it, never above. A member is a folder (everything under it)
 * or a single file.
 */
const LAYERS: ReadonlyArray<readonly string[]> = [
  ['schemas'],
  ['src/shared'],
  ['src/config.ts', 'src/redis-config.ts', 'src/drain-timeline.ts'],
  ['src/http', 'src/observability'],
  ['src/auth', 'src/limits', 'src/engine-client'],
  ['src/routes'],
  ['src/reference-engine'],
  ['src/app.ts'],
  ['src/compose.ts'],
  ['src/main.ts', 'src/process-log.ts', 'src/server.ts', 'src/workers.ts'],
  ['src/cli']
]

/**
 * Beside the layers: the reference engine is a separate service that happens to ship here, so it imports
 * only these.
 */
const REFERENCE_ENGINE = 'src/reference-engine'
const REFERENCE_ENGINE_MAY_IMPORT = ['src/reference-engine', 'src/shared', 'schemas']

interface Import { file: string, line: number, target: string }

function sourceFiles (dir: string): string[] {
  const found: string[] = []
  for (const entry of readdirSync(path.join(ROOT, dir), { withFileTypes: true })) {
    const rel = path.posix.join(dir, entry.name)
    if (entry.isDirectory()) found.push(...sourceFiles(rel))
    else if (entry.name.endsWith('.ts') && !entry.name.endsWith('.d.ts')) found.push(rel)
  }
  return found.sort()
}

/**
 * Every relative import of `file`, resolved to a .ts path relative to the root:
 * static imports and re-exports, dynamic `import('...')` and `import('...').T`
 * type queries anywhere in the file (a lazily loaded module is a dependency too).
 */
function importsOf (file: string): Import[] {
  const source = ts.createSourceFile(file, readFileSync(path.join(ROOT, file), 'utf8'), ts.ScriptTarget.Latest, false)
  const found: Import[] = []
  const add = (node: ts.Node, spec: ts.Node | undefined): void => {
    if (spec === undefined || !ts.isStringLiteral(spec) || !spec.text.startsWith('.')) return
    const target = path.posix.normalize(path.posix.join(path.posix.dirname(file), spec.text)).replace(/\.js$/, '.ts')
    found.push({ file, line: source.getLineAndCharacterOfPosition(node.getStart(source)).line + 1, target })
  }
  const visit = (node: ts.Node): void => {
    const dynamic = ts.isCallExpression(node) && node.expression.kind === ts.SyntaxKind.ImportKeyword
    if (ts.isImportDeclaration(node) || ts.isExportDeclaration(node)) add(node, node.moduleSpecifier)
    else if (dynamic) add(node, node.arguments[0])
    else if (ts.isImportTypeNode(node) && ts.isLiteralTypeNode(node.argument)) add(node, node.argument.literal)
    ts.forEachChild(node, visit)
  }
  visit(source)
  return found
}

const FILES = [...sourceFiles('src'), ...sourceFiles('schemas')]
const IMPORTS = FILES.flatMap(importsOf)
const within = (file: string, member: string): boolean => file === member || file.startsWith(member + '/')

function layerOf (file: string): number {
  const index = LAYERS.findIndex((members) => members.some((m) => within(file, m)))
  return index
}

t.test('every file of src/ and schemas/ has its place in LAYERS', async (t) => {
  t.ok(FILES.length > 50, `${FILES.length} files read`)
  t.same(FILES.filter((f) => layerOf(f) < 0), [], 'files in no layer: add their folder to LAYERS')
  t.same(IMPORTS.filter(({ target }) => !FILES.includes(target)).map(({ file, line, target }) => `${file}:${line} -> ${target}`), [], 'every relative import resolves to a file read')
})

t.test('no file imports from a layer above its own', async (t) => {
  const upward = IMPORTS
    .filter(({ file, target }) => FILES.includes(target) && layerOf(target) > layerOf(file))
    .map(({ file, line, target }) => `${file}:${line} -> ${target}`)
  t.same(upward, [], 'upward imports (file:line -> target)')
})

t.test('the reference engine imports only src/reference-engine, src/shared and schemas', async (t) => {
  const imports = IMPORTS.filter(({ file }) => within(file, REFERENCE_ENGINE))
  t.ok(imports.length > 10, 'its imports were found')
  t.same(imports.filter(({ target }) => !REFERENCE_ENGINE_MAY_IMPORT.some((m) => within(target, m))).map(({ file, line, target }) => `${file}:${line} -> ${target}`), [])
})

t.test('src/shared imports only src/shared and schemas', async (t) => {
  const imports = IMPORTS.filter(({ file }) => within(file, 'src/shared'))
  t.ok(imports.length > 0, 'its imports were found')
  t.same(imports.filter(({ target }) => !within(target, 'src/shared') && !within(target, 'schemas')).map(({ file, line, target }) => `${file}:${line} -> ${target}`), [])
})

/** Each cycle once, as the files round it from its smallest name: a depth-first search over the import graph. */
function cycles (): string[] {
  const edges = new Map<string, string[]>()
  for (const { file, target } of IMPORTS) {
    if (!FILES.includes(target)) continue
    edges.set(file, [...new Set([...(edges.get(file) ?? []), target])].sort())
  }
  const found = new Set<string>()
  const state = new Map<string, 'open' | 'done'>()
  const stack: string[] = []
  function visit (file: string): void {
    state.set(file, 'open')
    stack.push(file)
    for (const next of edges.get(file) ?? []) {
      if (state.get(next) === 'open') {
        const loop = stack.slice(stack.indexOf(next))
        const start = loop.indexOf([...loop].sort()[0]!)
        const rotated = [...loop.slice(start), ...loop.slice(0, start)]
        found.add([...rotated, rotated[0]].join(' -> '))
      } else if (!state.has(next)) visit(next)
    }
    stack.pop()
    state.set(file, 'done')
  }
  for (const file of FILES) if (!state.has(file)) visit(file)
  return [...found].sort()
}

t.test('no files of src/ import each other, directly or round a loop', async (t) => {
  t.same(cycles(), [], 'import cycles')
})

t.test('the cycle search finds a cycle when there is one', async (t) => {
  // The search itself, on a graph known to loop: a guard that cannot fail proves nothing.
  const saved = IMPORTS.splice(0, IMPORTS.length, { file: 'src/shared/env.ts', line: 1, target: 'src/shared/drain.ts' }, { file: 'src/shared/drain.ts', line: 1, target: 'src/shared/env.ts' })
  try {
    t.same(cycles(), ['src/shared/drain.ts -> src/shared/env.ts -> src/shared/drain.ts'])
  } finally {
    IMPORTS.splice(0, IMPORTS.length, ...saved)
  }
})

/**
 * Members this project adds to FastifyInstance (module augmentation of 'fastify'), each with the folder
 * that declares it. Request decorations (FastifyRequest) are not among them: they carry one request's
 * state from the hook that sets it to the code that reads it later (the verified user, the trace), and
 * that reader is in another folder by design.
 */
function instanceDecorations (sources: ts.SourceFile[]): Map<string, string> {
  const declared = new Map<string, string>()
  for (const source of sources) {
    for (const statement of source.statements) {
      if (!ts.isModuleDeclaration(statement) || statement.name.text !== 'fastify') continue
      if (statement.body === undefined || !ts.isModuleBlock(statement.body)) continue
      for (const member of statement.body.statements) {
        if (!ts.isInterfaceDeclaration(member) || member.name.text !== 'FastifyInstance') continue
        for (const field of member.members) {
          if (field.name === undefined || !ts.isIdentifier(field.name)) continue
          declared.set(field.name.text, path.posix.dirname(source.fileName))
        }
      }
    }
  }
  return declared
}

/** Every `x.name` of an instance decoration outside the folder that declares it, as file:line .name (folder). */
function decorationReadsAcrossFolders (sources: ts.SourceFile[]): string[] {
  const declared = instanceDecorations(sources)
  const found: string[] = []
  for (const source of sources) {
    const visit = (node: ts.Node): void => {
      if (ts.isPropertyAccessExpression(node)) {
        const folder = declared.get(node.name.text)
        if (folder !== undefined && folder !== path.posix.dirname(source.fileName)) {
          const line = source.getLineAndCharacterOfPosition(node.name.getStart(source)).line + 1
          found.push(`${source.fileName}:${line} .${node.name.text} (declared in ${folder})`)
        }
      }
      ts.forEachChild(node, visit)
    }
    visit(source)
  }
  return found
}

const parsed = (file: string, text: string): ts.SourceFile =>
  ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true)

t.test('no Fastify instance decoration is read outside the folder that declares it', async (t) => {
  // A decoration read elsewhere is a service locator: the reader depends on what some plugin registered
  // earlier. The parts are passed in instead (src/compose.ts). Plugins' own decorations (@fastify/jwt's
  // app.jwt, @fastify/swagger's app.swagger) are those libraries' API and are not declared here.
  const sources = FILES.map((file) => parsed(file, readFileSync(path.join(ROOT, file), 'utf8')))
  t.ok(instanceDecorations(sources).size > 0, 'the declarations were found')
  t.same(decorationReadsAcrossFolders(sources), [], 'decorations read across folders')
})

t.test('the decoration rule finds a read across folders when there is one', async (t) => {
  const sources = [
    parsed('src/a/plugin.ts', "declare module 'fastify' { interface FastifyInstance { things: number } }\napp.things = 1"),
    parsed('src/a/same.ts', 'export const n = app.things'),
    parsed('src/b/reader.ts', 'const x = 1\nexport const n = app.things')
  ]
  t.same(decorationReadsAcrossFolders(sources), ['src/b/reader.ts:2 .things (declared in src/a)'])
})

/** The longest a function body may run, in lines from its first to its last. */
const FUNCTION_MAX_LINES = 60

/**
 * Functions of src/ allowed past FUNCTION_MAX_LINES, as file:name: none today. An entry is a debt, not a licence;
 * the test fails when a listed function is shortened below the bound and left here.
 */
const LONG_FUNCTIONS_ALLOWED: readonly string[] = []

/** What a reader calls a function node: its name, or where it is assigned or passed. */
function functionName (node: ts.FunctionLikeDeclaration, source: ts.SourceFile): string {
  if (node.name !== undefined) return node.name.getText(source)
  if (ts.isConstructorDeclaration(node)) return `${node.parent.name?.getText(source) ?? ''}.constructor`
  const parent = node.parent
  if (ts.isVariableDeclaration(parent) || ts.isPropertyAssignment(parent) || ts.isPropertyDeclaration(parent)) {
    return parent.name.getText(source)
  }
  if (ts.isCallExpression(parent)) return `${parent.expression.getText(source).slice(0, 40)}(callback)`
  return '(anonymous)'
}

/** Every function-like node of `source` longer than `max` lines, as file:name (lines). */
function longFunctions (source: ts.SourceFile, max: number): string[] {
  const found: string[] = []
  const visit = (node: ts.Node): void => {
    if (ts.isFunctionLike(node) && 'body' in node && node.body !== undefined) {
      const fn = node as ts.FunctionLikeDeclaration
      const first = source.getLineAndCharacterOfPosition(fn.getStart(source)).line
      const last = source.getLineAndCharacterOfPosition(fn.getEnd()).line
      if (last - first + 1 > max) found.push(`${source.fileName}:${functionName(fn, source)} (${last - first + 1})`)
    }
    ts.forEachChild(node, visit)
  }
  visit(source)
  return found
}

t.test(`no function in src/ over ${FUNCTION_MAX_LINES} lines`, async (t) => {
  const sources = FILES.map((file) => parsed(file, readFileSync(path.join(ROOT, file), 'utf8')))
  const long = sources.flatMap((source) => longFunctions(source, FUNCTION_MAX_LINES))
  const named = long.map((entry) => entry.replace(/ \(\d+\)$/, ''))
  const unexpected = named.filter((entry) => !LONG_FUNCTIONS_ALLOWED.includes(entry))
  t.same(unexpected, [], `over ${FUNCTION_MAX_LINES} lines: ${long.join(', ')}`)
  t.same(LONG_FUNCTIONS_ALLOWED.filter((entry) => !named.includes(entry)), [], 'allowed but no longer long: take them off')
})

t.test('the function-length rule finds a long function, named where it is assigned', async (t) => {
  const body = Array.from({ length: 3 }, () => '  x++').join('\n')
  const source = parsed('src/a.ts', `const handler = () => {\n${body}\n}\nfunction short () {}`)
  t.same(longFunctions(source, 4), ['src/a.ts:handler (5)'])
})

/**
 * Where a test file lives, so a reader finds a source file's tests beside its path: test/ mirrors src/
 * (test/engine-client/ for src/engine-client/, test/routes/create/ for src/routes/create/), and the tests of
 * src/'s top-level files sit in test/ itself, each named for its file (server-drain.test.ts tests src/server.ts).
 * Tests with no single source of src/ live in one of these folders, each for what its name says.
 */
const CROSS_CUTTING_TEST_FOLDERS: readonly string[] = [
  'test/bench', // bench/'s smoke runs, which npm test runs after the others (.taprc)
  'test/bench-modules', // bench/'s modules, in the main run
  'test/client', // the typed client of client/, and the README's snippet of it
  'test/deploy', // deploy/: the recipes, their configs and the local topology
  'test/docs', // the manual against the code
  'test/e2e', // the gateway and the reference engine together
  'test/project', // the repository's own rules: layout, builds, CI, the helpers, private internals
  'test/schemas', // schemas/
  'test/whole-machine' // timing under load, run alone at the end (.taprc's serial rule)
]

/** Each test file out of place, with why. `srcEntries` are src/'s folders and top-level files, relative to src/. */
function misplacedTests (testFiles: readonly string[], srcEntries: ReadonlySet<string>): string[] {
  const topLevel = [...srcEntries].filter((entry) => entry.endsWith('.ts')).map((entry) => entry.slice(0, -3))
  return testFiles.flatMap((file) => {
    const folder = path.posix.dirname(file)
    const name = path.posix.basename(file, '.test.ts')
    if (folder === 'test') {
      const named = topLevel.some((source) => name === source || name.startsWith(source + '-'))
      return named ? [] : [`${file}: test/ itself holds only tests named for a top-level file of src/`]
    }
    if (srcEntries.has(folder.slice('test/'.length)) || CROSS_CUTTING_TEST_FOLDERS.includes(folder)) return []
    return [`${file}: ${folder}/ mirrors no folder of src/ and is not in CROSS_CUTTING_TEST_FOLDERS`]
  })
}

/** src/'s folders (as engine-client, routes/create) and top-level files (as server.ts). */
function srcEntries (): Set<string> {
  const entries = new Set<string>()
  for (const file of sourceFiles('src')) {
    const rel = file.slice('src/'.length)
    if (!rel.includes('/')) entries.add(rel)
    for (let dir = path.posix.dirname(rel); dir !== '.'; dir = path.posix.dirname(dir)) entries.add(dir)
  }
  return entries
}

const TEST_FILES = sourceFiles('test').filter((file) => file.endsWith('.test.ts'))

t.test('every test file lives in the folder that mirrors its source, or in a named cross-cutting folder', async (t) => {
  t.ok(TEST_FILES.length > 100, `${TEST_FILES.length} test files read`)
  t.same(misplacedTests(TEST_FILES, srcEntries()), [])
  t.same(CROSS_CUTTING_TEST_FOLDERS.filter((folder) => !TEST_FILES.some((file) => path.posix.dirname(file) === folder)),
    [], 'cross-cutting folders without a test: take them off')
})

/**
 * Per folder, not per file: most files of src/ are tested as behaviour over real sockets through the whole app
 * (a create's route, form writer and upload clock at once), which a test reaches through test/helpers' build(),
 * not by importing the file or being named for it; about 40 of the 100 files have neither, and naming a test for
 * each would split behaviour tests along the code's seams instead of along what they check.
 */
t.test('every folder of src/ has tests in the folder that mirrors it', async (t) => {
  const folders = [...srcEntries()].filter((entry) => !entry.endsWith('.ts'))
  t.ok(folders.length > 5, `${folders.length} folders of src/ read`)
  t.same(folders.filter((folder) => !TEST_FILES.some((file) => path.posix.dirname(file) === `test/${folder}`)), [],
    'folders of src/ with no test/<folder>/*.test.ts')
})

t.test('the test-layout rule finds a test put back at the wrong place', async (t) => {
  const entries = new Set(['http', 'routes', 'routes/create', 'server.ts'])
  t.same(misplacedTests([
    'test/http/request-id.test.ts',
    'test/routes/create/abort.test.ts',
    'test/server-drain.test.ts',
    'test/deploy/haproxy.test.ts',
    'test/create-abort.test.ts',
    'test/helpers/stray.test.ts',
    'test/engine-client/timeout.test.ts'
  ], entries), [
    'test/create-abort.test.ts: test/ itself holds only tests named for a top-level file of src/',
    'test/helpers/stray.test.ts: test/helpers/ mirrors no folder of src/ and is not in CROSS_CUTTING_TEST_FOLDERS',
    'test/engine-client/timeout.test.ts: test/engine-client/ mirrors no folder of src/ and is not in CROSS_CUTTING_TEST_FOLDERS'
  ])
})
