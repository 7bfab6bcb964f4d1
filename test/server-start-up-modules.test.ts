/**
 * A gateway loads the modules of a feature only when that feature is on: no
 * Redis client without REDIS_URL, no OpenTelemetry SDK or exporter without an
 * OTLP endpoint, and the reference engine no Redis client without its own
 * Redis. Each of those is tens of modules a process would read and compile at
 * every start (a rollout's new pods, a test's gateway processes) and keep in
 * memory for nothing.
 *
 * Real processes: the gateway's and the engine's scripts, each with a
 * preload that, on SIGUSR2, writes which packages the process has loaded.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import t, { type Test } from 'tap'
import { SECRET } from './helpers/app.js'
import { ENGINE_SCRIPT, ensureBuilt, freePort, GATEWAY_SCRIPT, startProcess, type Proc } from './helpers/processes.js'

/** Heavy packages that belong to a feature, never to every start. */
const FEATURE_PACKAGES = ['ioredis', '@opentelemetry/sdk-trace', '@opentelemetry/exporter-trace-otlp-proto']

// OpenTelemetry's packages are ES modules, which require.cache never lists: a load hook sees both kinds.
const PRELOAD = `import { registerHooks } from 'node:module'
const seen = new Set()
registerHooks({ load (url, context, next) { seen.add(url); return next(url, context) } })
process.on('SIGUSR2', () => {
  const names = new Set()
  for (const file of seen) {
    const m = /node_modules\\/((?:@[^/]+\\/)?[^/]+)\\//.exec(file)
    if (m) names.add(m[1])
  }
  process.stdout.write('loaded packages: ' + JSON.stringify([...names].sort()) + '\\n')
})
`

const dir = mkdtempSync(join(tmpdir(), 'start-up-modules-'))
t.teardown(() => rmSync(dir, { recursive: true, force: true }))
const preload = join(dir, 'loaded.mjs')
writeFileSync(preload, PRELOAD)

async function loadedBy (proc: Proc): Promise<string[]> {
  proc.proc.kill('SIGUSR2')
  await proc.waitFor(/loaded packages: /)
  return JSON.parse(/loaded packages: (.*)\n/.exec(proc.out())![1]!) as string[]
}

async function gateway (t: Test, env: Record<string, string>): Promise<Proc> {
  const port = await freePort()
  return await startProcess(t, GATEWAY_SCRIPT, { PORT: String(port), HOST: '127.0.0.1', JWT_SECRET: SECRET, UPSTREAM_URL: 'http://127.0.0.1:9', NODE_OPTIONS: `--import ${pathToFileURL(preload).href}`, ...env }, port, /gateway ready/)
}

ensureBuilt()

t.test('a gateway without Redis and without an OTLP endpoint loads neither', async (t) => {
  const loaded = await loadedBy(await gateway(t, {}))
  t.ok(loaded.includes('fastify') && loaded.includes('undici'), 'the preload sees what the gateway loads')
  t.same(FEATURE_PACKAGES.filter((name) => loaded.includes(name)), [])
})

t.test('with REDIS_URL and an OTLP endpoint, their packages are loaded', async (t) => {
  // Neither needs to answer: the Redis client connects in the background, and nothing is exported before a span ends.
  const loaded = await loadedBy(await gateway(t, { REDIS_URL: 'redis://127.0.0.1:9', OTEL_EXPORTER_OTLP_ENDPOINT: 'http://127.0.0.1:9' }))
  t.same(FEATURE_PACKAGES.filter((name) => !loaded.includes(name)), [])
})

t.test('the reference engine without its own Redis loads no Redis client', async (t) => {
  const port = await freePort()
  const engine = await startProcess(t, ENGINE_SCRIPT, { ENGINE_PORT: String(port), ENGINE_HOST: '127.0.0.1', ENGINE_IMAGE_DIR: dir, NODE_OPTIONS: `--import ${pathToFileURL(preload).href}` }, port, /portfolio engine ready/)
  const loaded = await loadedBy(engine)
  t.ok(loaded.includes('fastify'), 'the preload sees what the engine loads')
  t.notOk(loaded.includes('ioredis'))
})
