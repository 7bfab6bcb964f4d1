/**
 * A client team's first hour: the README's typed-client snippet compiles in
 * strict mode as written and runs against a gateway and the reference engine;
 * the generated types name every operation and narrow errors by status and code.
 */
import { execFile } from 'node:child_process'
import { readFileSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { promisify } from 'node:util'
import t from 'tap'
import ts from 'typescript'
import { build, hs256 } from '../helpers/app.js'
import { startEngine } from '../helpers/engine.js'
import { ROOT } from '../helpers/processes.js'

const run = promisify(execFile)
// Type-checking the client and its generated types costs several seconds of CPU, tens on a loaded runner.
t.setTimeout(150_000)

/** The README's TypeScript block that uses the typed client. */
const snippet = ((): string => {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8')
  const blocks = [...readme.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]!)
  const block = blocks.find((code) => code.includes('./client/index.js'))
  if (block === undefined) throw new Error('README.md has no ```ts block importing ./client/index.js')
  return block
})()

/** Type-check `source` as if it were the file `name` at the repository's root, with the project's strict options. */
function typeErrors (name: string, source: string): string[] {
  const file = join(ROOT, name)
  const host0 = { ...ts.sys, onUnRecoverableConfigFileDiagnostic: () => {} }
  const config = ts.getParsedCommandLineOfConfigFile(join(ROOT, 'tsconfig.json'), {}, host0)!
  const host = ts.createCompilerHost(config.options)
  const { getSourceFile, fileExists, readFile } = host
  host.fileExists = (path) => path === file || fileExists(path)
  host.readFile = (path) => (path === file ? source : readFile(path))
  host.getSourceFile = (path, ...rest) =>
    (path === file ? ts.createSourceFile(path, source, ts.ScriptTarget.ES2022, true) : getSourceFile(path, ...rest))
  const program = ts.createProgram([file], { ...config.options, noEmit: true, strict: true }, host)
  return ts.getPreEmitDiagnostics(program)
    .filter((d) => d.file?.fileName === file)
    .map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n'))
}

t.test('the README snippet compiles in strict mode and runs against a gateway', async (t) => {
  t.same(typeErrors('readme-snippet.ts', snippet), [], 'no type error')
  const engine = await startEngine(t)
  const { url } = await build(t, { upstreamUrl: engine.origin })
  // Compiled beside dist/client/index.js, which its import names.
  const compiled = join(ROOT, 'dist', `readme-snippet-${process.pid}.mjs`)
  const compilerOptions = { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 }
  writeFileSync(compiled, ts.transpileModule(snippet, { compilerOptions }).outputText)
  t.teardown(() => rmSync(compiled, { force: true }))
  const { stdout } = await run(process.execPath, [compiled], {
    cwd: ROOT,
    env: { PATH: process.env['PATH'] ?? '', GATEWAY_URL: url, TOKEN: hs256({ sub: 'readme' }) },
    timeout: 30_000
  })
  t.equal(stdout, 'Target positions updated\n')
  t.equal(engine.engine.portfolios.size, 1, 'the portfolio was made, with its image')
})

t.test('the generated types: a method per operation, errors narrowed by status and code, image bytes', async (t) => {
  const checks = `
import { createGatewayClient, type operations } from './client/index.js'
const ids: Array<keyof operations> = [
  'createPortfolio', 'updatePortfolio', 'pingEngine', 'getEngineHealth', 'getLiveness', 'ping', 'getOpenApiDocument'
]
const gateway = createGatewayClient({ baseUrl: 'http://gw', token: 't' })
const created = await gateway.createPortfolio({ name: 'n', type: 'PORTFOLIO', image: new Uint8Array([0x89]) })
if (!created.ok && created.status === 409) {
  const code: 'IDEMPOTENCY_KEY_IN_USE' = created.error.error.code
  // @ts-expect-error a 409 carries no other code
  const other: 'VALIDATION_ERROR' = created.error.error.code
}
if (!created.ok && created.status === 401) {
  const message: string = created.error.error
}
const updated = await gateway.updatePortfolio({ portfolio_id: 'p', target_positions: [] })
if (!updated.ok && updated.status === 422) {
  const code: 'IDEMPOTENCY_KEY_REUSED' = updated.error.error.code
}
// @ts-expect-error the image is bytes, not a string
await gateway.createPortfolio({ name: 'n', type: 'PORTFOLIO', image: 'not bytes' })
// @ts-expect-error create declares no 404
if (!created.ok && created.status === 404) console.log(created)
export { ids }
`
  t.same(typeErrors('readme-types.ts', checks), [])
})
