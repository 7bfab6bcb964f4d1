/**
 * Load-test harness: `npm run bench -- [options]`, see `--help`.
 *
 * Locally it starts the mock upstream, nginx (when installed) and two
 * gateways (LOG_LEVEL=warn and info) as child processes, then drives load at
 * each scenario in turn from this process. Every round measures every
 * scenario, each cost row right beside its base (bench/schedule.ts), so a
 * ratio compares measurements seconds apart, and the report takes the median
 * of the rounds.
 */
import { existsSync } from 'node:fs'
import { writeFile } from 'node:fs/promises'
import { loadavg } from 'node:os'
import path from 'node:path'
import { parseArgs } from 'node:util'
import autocannon from 'autocannon'
import { renderChart } from './chart.js'
import { answeredOf, openLoop } from './open-loop.js'
import { detectFeatures, whyUnavailable, type Missing } from './features.js'
import { startKeyServer, type KeyServer } from '../fixtures/key-server.js'
import { mintToken, randomSecret } from './payloads.js'
import { startOtlpSinkProcess } from './otlp-sink.js'
import {
  BARE_GATEWAY_ENV,
  cpuSeconds,
  freePort,
  GATEWAY_SCRIPT,
  NGINX_BINARY,
  signalAll,
  startBareProxy,
  startGateway,
  startMock,
  startNginx,
  startRedis,
  startRedisCluster,
  stopAll,
  type Server
} from './processes.js'
import {
  CAPACITY_START,
  CAPACITY_STEP,
  CAPACITY_STEPS_MAX,
  capacityOf,
  costTable,
  formatCosts,
  formatLatency,
  isSustained,
  latencyVerdict,
  writeMarkdown,
  type CapacityStep,
  type LatencyPoint,
  type LatencyReport
} from './costs.js'
import {
  roundSchedule,
  ROWS_PER_BASE,
  SETTLE_DEFAULT_S,
  settleShares,
  TWIN_SUFFIX,
  type Measurement
} from './schedule.js'
import { renderCostChart } from './chart.js'
import {
  formatRuntimeMarkdown,
  parseRuntime,
  runtimeSchedule,
  runtimeTable,
  withRuntimes,
  type Runtime
} from './runtimes.js'
import {
  formatProblems,
  formatRatios,
  formatSaturation,
  formatTable,
  machineReport,
  median,
  mergeRounds,
  quantile,
  ratios,
  saturationVerdict,
  skippedSummary,
  summarize,
  type Probe,
  type Round,
  type SaturationPoint,
  type ScenarioSummary
} from './report.js'
import {
  buildRequest,
  freshHeaders,
  GATEWAYS,
  isGateway,
  SCENARIOS,
  setupCreateRequest,
  type BuiltRequest,
  type GatewayName,
  type GatewaySpec,
  type RequestContext,
  type Scenario,
  type TargetName
} from './scenarios.js'

/**
 * The rate limit when on: the highest RATE_LIMIT_PER_MINUTE accepts, per user
 * and fixed 60 s window. A round (10 s at up to ~20,000 req/s) stays well
 * under it; the open loop uses a user of its own so it starts a fresh window.
 */
const NEVER_REACHED_PER_MINUTE = '1000000'
/** Offered load past saturation, as multiples of the measured capacity. */
const SATURATION_MULTIPLES = [0.5, 1, 1.5, 2] as const
const SATURATION = 'saturation'
/**
 * Latency for phones: the bare proxy and the everything-on gateway at the
 * same offered loads, these multiples of the everything-on gateway's
 * measured capacity, in an open loop.
 */
const LATENCY_MULTIPLES = [0.5, 0.9] as const
const LATENCY = 'latency'
const LATENCY_PAIR = ['bare-ping', 'prod-ping'] as const
const KNOWN = [...SCENARIOS.map((s) => s.name), SATURATION, LATENCY]
const BEFORE = TWIN_SUFFIX
/** The fewest rounds a table written with --markdown may be the median of. */
const MARKDOWN_ROUNDS_MIN = 3

/**
 * --compare: each gateway scenario again on another build (its gateway
 * configurations named <gateway>@before, run from that build's dist/), so
 * one run's rounds interleave the two builds.
 */
function withTwins (scenarios: readonly Scenario[], compare: string | undefined): Scenario[] {
  if (compare === undefined) return [...scenarios]
  // Each twin right after its original: between the same two base measurements of a round (bench/schedule.ts).
  return scenarios.flatMap((s): Scenario[] => {
    if (!isGateway(s.target)) return [s]
    const target = `${s.target}${BEFORE}`
    GATEWAYS[target] = { ...gatewaySpec(s.target), script: path.join(compare, 'src', 'server.js') }
    return [
      s,
      {
        ...s,
        name: `${s.name}${BEFORE}`,
        description: `${s.description} (${compare})`,
        target,
        ...(s.cost === undefined
          ? {}
          : {
              cost: {
                ...s.cost,
                feature: `${s.cost.feature} (before)`,
                ...(s.cost.adds === undefined ? {} : { adds: `${s.cost.adds}${BEFORE}` })
              }
            })
      }
    ]
  })
}

const HELP = `usage: node dist/bench/run.js [options]
  --duration S      seconds per scenario per round (default 10)
  --connections N   concurrent connections (default 50; create-10mib uses at most 4)
  --rounds N        rounds; the report shows the median (default 3; --markdown needs at least 3)
  --rows-per-base N cost rows measured between two measurements of their base (bare-ping or bare-update)
                    in each round: 2 is B X1 X2 B X3 X4 B, 1 is B X1 B X2 B (more base measurements, a longer run)
                    (default ${ROWS_PER_BASE})
  --warmup S        seconds of unmeasured load per scenario right before each round (default 1)
  --settle S        seconds of unmeasured load for every server process once, before round 1, split
                    among the scenarios it serves (default ${SETTLE_DEFAULT_S}; 0 with --target), so each
                    measures with its code compiled: a gateway under load goes on optimising its
                    functions for well over the first warm-up, on compiler threads whose CPU counts
  --only a,b        scenarios to run: ${KNOWN.join(', ')}
                    (saturation: open loop on the everything-on gateway at ${SATURATION_MULTIPLES.join(', ')} x the
                    capacity measured by prod-ping, or ping when prod-ping is not run;
                    latency: open loop on bare-ping and prod-ping at ${LATENCY_MULTIPLES.join(' and ')} x prod-ping's capacity, measured in the open loop)
  --capacity-steps N  most steps of the latency pair's open-loop capacity search (default ${CAPACITY_STEPS_MAX};
                    the test suite's smoke run takes 2: it checks the report's shape, not a capacity)
  --saturation-connections N  most connections the open loop opens (default 1000: so the load reaches
                    the gateway, which can then shed it, instead of queueing in the generator)
  --json PATH       also write the results as JSON
  --chart PATH      also draw the ratios and the saturation curves as an SVG file
  --markdown PATH   write the cost table and the latency table into PATH (e.g. docs/performance.md),
                    between its "bench:begin" and "bench:end" comment lines (the rest is kept)
  --cost-chart PATH draw the cost table as an SVG file (e.g. docs/feature-cost.svg)
  --shed-delay-ms N SHED_EVENT_LOOP_DELAY_MS of the gateways with load shedding on (ping-shedding and the
                    everything-on ones; default 200, the product's own). The test suite's smoke run gives 5000:
                    the shedding code still runs, but one stall of a gateway on a busy machine sheds nothing
  --prod-env K=V,.. settings for the everything-on gateways on top of the profile, e.g.
                    SHED_EVENT_LOOP_DELAY_MS=50,UPSTREAM_MAX_QUEUE=32 (to try a shedding setting)
  --profile DIR     run every gateway and the bare proxy under \`node --cpu-prof\` and write their
                    profiles to DIR (summarise: node bench/tools/profile-summary.mjs DIR/<gateway>)
  --compare DIST    also run every selected gateway scenario on another build's dist/ (e.g. of an older
                    commit), as <name>@before, interleaved in the same rounds: a before/after table in one run
  --runtime L=NODE[,DIST]  run every selected bare proxy and gateway scenario under this node binary (and from
                    this build's dist/, default the harness's), as <name>@L; give it twice or more: each round
                    measures a scenario's copies back to back, and the report is a runtime table, not the cost table
                    (e.g. --runtime node20=/usr/bin/node,/old/dist --runtime node24=$(which node),/old/dist)
  --target URL      measure a running gateway instead of starting one (no direct/nginx/ping-logging;
                    create-10mib only when named in --only)
  --token JWT       bearer token for --target (default: minted from $JWT_SECRET)
`

interface Options {
  duration: number
  connections: number
  rounds: number
  rowsPerBase: number
  warmup: number
  settle: number
  only: string[]
  json?: string
  chart?: string
  markdown?: string
  costChart?: string
  profile?: string
  /** Another build's dist/ whose gateway runs the `@before` twins. */
  compare?: string
  /** --runtime: the node binaries (and builds) whose copies of each scenario one run interleaves. */
  runtimes: Runtime[]
  prodEnv: Record<string, string>
  /** --shed-delay-ms: SHED_EVENT_LOOP_DELAY_MS of the gateways that shed. */
  shedDelayMs: number
  saturationConnections: number
  capacitySteps: number
  target?: string
  token?: string
}

function parseOptions (argv: string[]): Options {
  const { values } = parseArgs({
    args: argv,
    options: {
      duration: { type: 'string', default: '10' },
      connections: { type: 'string', default: '50' },
      rounds: { type: 'string', default: '3' },
      'rows-per-base': { type: 'string', default: String(ROWS_PER_BASE) },
      warmup: { type: 'string', default: '1' },
      settle: { type: 'string' },
      only: { type: 'string' },
      json: { type: 'string' },
      chart: { type: 'string' },
      markdown: { type: 'string' },
      'cost-chart': { type: 'string' },
      profile: { type: 'string' },
      compare: { type: 'string' },
      runtime: { type: 'string', multiple: true },
      'prod-env': { type: 'string' },
      'shed-delay-ms': { type: 'string', default: '200' },
      'saturation-connections': { type: 'string', default: '1000' },
      'capacity-steps': { type: 'string', default: String(CAPACITY_STEPS_MAX) },
      target: { type: 'string' },
      token: { type: 'string' },
      help: { type: 'boolean', default: false }
    }
  })
  if (values.help) {
    process.stdout.write(HELP)
    process.exit(0)
  }
  const number = (name: string, text: string, min: number, integer: boolean): number => {
    const n = Number(text)
    if (!Number.isFinite(n) || n < min || (integer && !Number.isInteger(n))) { throw new Error(`--${name} ${text}: expected ${integer ? 'an integer' : 'a number'} >= ${min}`) }
    return n
  }
  const only =
    values.only === undefined
      ? []
      : values.only
          .split(',')
          .map((s) => s.trim())
          .filter((s) => s !== '')
  const unknown = only.filter((name) => !KNOWN.includes(name.replace(/@[^@]*$/, '')))
  if (unknown.length > 0) throw new Error(`--only: unknown scenario ${unknown.join(', ')}; known: ${KNOWN.join(', ')}`)
  const rounds = number('rounds', values.rounds, 1, true)
  const rowsPerBaseOf = (text: string): number => {
    if (text !== '1' && text !== '2') {
      throw new Error(
        `--rows-per-base ${text}: expected 1 or 2 (with more, a row in the middle would not be next to its base)`
      )
    }
    return Number(text)
  }
  // The published table is a median of rounds: of one or two it would be a single disturbed round's word.
  if (values.markdown !== undefined && rounds < MARKDOWN_ROUNDS_MIN) {
    throw new Error(
      `--markdown needs --rounds ${MARKDOWN_ROUNDS_MIN} or more (the table is the median of at least ${MARKDOWN_ROUNDS_MIN} rounds); got --rounds ${rounds}`
    )
  }
  const runtimes = (values.runtime ?? []).map((text) => parseRuntime(text, path.dirname(path.dirname(GATEWAY_SCRIPT))))
  if (runtimes.length === 1) throw new Error('--runtime: give two or more, the table compares them')
  if (new Set(runtimes.map((r) => r.label)).size !== runtimes.length) throw new Error('--runtime: each label once')
  const alone = values.compare === undefined && values.target === undefined && values.markdown === undefined
  if (runtimes.length > 0 && !alone) {
    throw new Error('--runtime makes a runtime table of its own: not with --compare, --target or --markdown')
  }
  for (const r of runtimes) {
    for (const file of [r.node, path.join(r.dist, 'src', 'server.js'), path.join(r.dist, 'bench', 'bare-proxy.js')]) {
      if (!existsSync(file)) throw new Error(`--runtime ${r.label}: ${file} does not exist`)
    }
  }
  return {
    runtimes,
    duration: number('duration', values.duration, 0.1, false),
    connections: number('connections', values.connections, 1, true),
    rounds,
    rowsPerBase: rowsPerBaseOf(values['rows-per-base']),
    warmup: number('warmup', values.warmup, 0, false),
    // A running deployment has compiled its code long ago: against --target, no settling unless asked.
    settle:
      values.settle === undefined
        ? values.target === undefined
          ? SETTLE_DEFAULT_S
          : 0
        : number('settle', values.settle, 0, false),
    only,
    saturationConnections: number('saturation-connections', values['saturation-connections'], 1, true),
    capacitySteps: number('capacity-steps', values['capacity-steps'], 1, true),
    shedDelayMs: number('shed-delay-ms', values['shed-delay-ms'], 1, true),
    prodEnv: Object.fromEntries(
      (values['prod-env'] ?? '')
        .split(',')
        .filter((kv) => kv !== '')
        .map((kv) => {
          const at = kv.indexOf('=')
          if (at < 1) throw new Error(`--prod-env ${kv}: expected NAME=value`)
          return [kv.slice(0, at), kv.slice(at + 1)]
        })
    ),
    ...(values.json === undefined ? {} : { json: values.json }),
    ...(values.chart === undefined ? {} : { chart: values.chart }),
    ...(values.markdown === undefined ? {} : { markdown: values.markdown }),
    ...(values['cost-chart'] === undefined ? {} : { costChart: values['cost-chart'] }),
    ...(values.profile === undefined ? {} : { profile: path.resolve(values.profile) }),
    ...(values.compare === undefined ? {} : { compare: path.resolve(values.compare) }),
    ...(values.target === undefined ? {} : { target: values.target.replace(/\/$/, '') }),
    ...(values.token === undefined ? {} : { token: values.token })
  }
}

interface LoadResult {
  result: autocannon.Result
  /** Every response's latency in ms, sorted. */
  latencies: Float64Array
}

/** A growable list of latencies; autocannon's own histogram would round them to whole ms. */
class Latencies {
  private values = new Float64Array(1 << 16)
  private count = 0
  push (value: number): void {
    if (this.count === this.values.length) {
      const grown = new Float64Array(this.values.length * 2)
      grown.set(this.values)
      this.values = grown
    }
    this.values[this.count++] = value
  }

  sorted (): Float64Array {
    return this.values.subarray(0, this.count).sort()
  }
}

/**
 * Run autocannon and keep every latency ourselves: autocannon's histogram
 * stores whole milliseconds, and on loopback most answers take less than one,
 * so its p50 would read 0 for every scenario.
 */
async function cannon (url: string, request: BuiltRequest, connections: number, duration: number): Promise<LoadResult> {
  const all = new Latencies()
  const fresh = request.fresh ?? []
  return await new Promise((resolve, reject) => {
    const instance = autocannon(
      {
        url: url + request.path,
        method: request.method,
        headers: request.headers,
        ...(request.body === undefined ? {} : { body: request.body }),
        // New header values on every request (a reused Idempotency-Key is a replay, not an update).
        ...(fresh.length === 0
          ? {}
          : {
              requests: [{ setupRequest: (req) => ({ ...req, headers: { ...req.headers, ...freshHeaders(fresh) } }) }]
            }),
        // Fixed header sets in turn: no setupRequest, so autocannon builds each request once.
        ...(request.rotate === undefined
          ? {}
          : { requests: request.rotate.map((headers) => ({ headers: { ...request.headers, ...headers } })) }),
        connections,
        duration,
        // autocannon stops at its first sample tick after the duration, one a second by default:
        // ticks that divide the duration, so 1.67 s (a settling share) lasts 1.67 s, not 2, and a
        // sub-second --duration (the test suite's smoke run) not a whole second.
        sampleInt: (duration * 1000) / Math.max(1, Math.ceil(duration))
      },
      (err, result) => {
        if (err !== null) reject(err)
        else resolve({ result, latencies: all.sorted() })
      }
    )
    instance.on('response', (_client, _status, _bytes, responseTime) => {
      all.push(responseTime)
    })
  })
}

/** One request outside the load, to record what the server answers (and why, when it is not 2xx). */
async function probe (url: string, request: BuiltRequest): Promise<Probe> {
  try {
    const res = await fetch(url + request.path, {
      method: request.method,
      headers: request.headers,
      // fetch's types want an ArrayBuffer-backed view; a Buffer may sit on a shared pool.
      ...(request.body === undefined
        ? {}
        : { body: typeof request.body === 'string' ? request.body : Uint8Array.from(request.body) }),
      signal: AbortSignal.timeout(15_000)
    })
    return { status: res.status, body: (await res.text()).slice(0, 300) }
  } catch (err) {
    return { status: 0, body: err instanceof Error ? `${err.message} ${String(err.cause ?? '')}`.trim() : String(err) }
  }
}

/** A portfolio the bench user owns, so a real engine answers updates with 200 rather than 404. */
async function setupPortfolio (gatewayUrl: string, token: string): Promise<{ context: RequestContext; note?: string }> {
  const answer = await probe(gatewayUrl, setupCreateRequest(token))
  try {
    const id: unknown = (JSON.parse(answer.body) as { portfolio_id?: unknown }).portfolio_id
    if (answer.status === 200 && typeof id === 'string') return { context: { portfolioId: id } }
  } catch {
    /* not JSON: fall through */
  }
  return {
    context: { portfolioId: 'bench-portfolio' },
    note: `setup create answered ${answer.status} ${answer.body.slice(0, 120)}; updates use the id "bench-portfolio"`
  }
}

interface Measured {
  server: Server | null
  url: string
}

async function measureRound (
  scenario: Scenario,
  target: Measured,
  mock: Server | null,
  request: BuiltRequest,
  options: Options
): Promise<Round> {
  const connections = scenario.connections?.(options.connections) ?? options.connections
  const serverPids = (await target.server?.pids()) ?? []
  // The mock is the upstream of every local target; counted separately unless it is the target itself.
  const mockPids = mock !== null && target.server !== mock ? await mock.pids() : []
  const [serverBefore, mockBefore] = await Promise.all([cpuSeconds(serverPids), cpuSeconds(mockPids)])
  const ownBefore = process.cpuUsage()
  const started = process.hrtime.bigint()
  const { result, latencies } = await cannon(target.url, request, connections, options.duration)
  const wall = Number(process.hrtime.bigint() - started) / 1e9
  const own = process.cpuUsage(ownBefore)
  const [serverAfter, mockAfter] = await Promise.all([cpuSeconds(serverPids), cpuSeconds(mockPids)])
  const statusCodes: Record<string, number> = {}
  for (const [code, { count }] of Object.entries(result.statusCodeStats)) statusCodes[code] = Number(count)
  const busy = (cpu: number): number => Math.round((cpu / wall) * 100) / 100
  // For `direct` the mock is the server under test.
  const serverSystem = serverAfter.system - serverBefore.system
  const serverCpu = target.server === null ? Number.NaN : serverAfter.user - serverBefore.user + serverSystem
  return {
    rps: Math.round(result.requests.total / result.duration),
    p50: quantile(latencies, 0.5),
    p99: quantile(latencies, 0.99),
    non2xx: result.non2xx,
    errors: result.errors,
    timeouts: result.timeouts,
    statusCodes,
    cpu: {
      server: busy(serverCpu),
      serverUsPerRequest:
        result.requests.total === 0 ? Number.NaN : Math.round((serverCpu * 1e6) / result.requests.total),
      serverSystemShare: serverCpu > 0 ? Math.round((serverSystem / serverCpu) * 100) / 100 : Number.NaN,
      mock:
        mockPids.length === 0
          ? Number.NaN
          : busy(mockAfter.user + mockAfter.system - mockBefore.user - mockBefore.system),
      loadgen: busy((own.user + own.system) / 1e6)
    }
  }
}

/** What the gateways need from the harness: secrets, the key server, Redis. */
interface GatewayContext {
  upstreamUrl: string
  /** The second mock, for gateways with `engines: 2`. */
  secondUpstreamUrl?: string
  /** Where the everything-on gateways write CPU profiles, if anywhere. */
  profileDir?: string
  /** --prod-env: applied last to the everything-on gateways. */
  prodEnv: Record<string, string>
  /** --shed-delay-ms. */
  shedDelayMs: number
  secret: string
  keyServer: KeyServer | null
  redis: Server | null
  /** REDIS_CLUSTER_NODES of a three-primary cluster, for the cluster scenario. */
  redisCluster: Server | null
}

/** The environment for one gateway configuration: every feature off unless the spec turns it on. */
async function gatewayEnv (spec: GatewaySpec, context: GatewayContext): Promise<Record<string, string>> {
  const env: Record<string, string> = { ...BARE_GATEWAY_ENV }
  if (spec.auth === 'keyset' && context.keyServer !== null) {
    Object.assign(env, {
      JWT_JWKS_URL: context.keyServer.url,
      JWT_ISSUER: KEY_SET_ISSUER,
      JWT_AUDIENCE: KEY_SET_AUDIENCE
    })
  }
  if (spec.rateLimit !== 'off') env.RATE_LIMIT_PER_MINUTE = NEVER_REACHED_PER_MINUTE
  if (spec.rateLimit === 'redis' && context.redis !== null) env.REDIS_URL = context.redis.url
  if (spec.rateLimit === 'redis-cluster' && context.redisCluster !== null) { env.REDIS_CLUSTER_NODES = context.redisCluster.url }
  // Metrics on a port of its own, never the default 9464 another process may hold.
  if (spec.metrics) env.METRICS_PORT = String(await freePort())
  if (spec.shedding) env.SHED_EVENT_LOOP_DELAY_MS = String(context.shedDelayMs)
  if (spec.traceRatio !== undefined) Object.assign(env, await otlpSinkEnv(spec.traceRatio))
  return { ...env, ...spec.env }
}

/** The traced scenarios' collector: one sink process for the run, started when first needed. */
let otlpSink: Promise<{ url: string }> | undefined
async function otlpSinkEnv (ratio: number): Promise<Record<string, string>> {
  const { url } = await (otlpSink ??= startOtlpSinkProcess())
  return { OTEL_EXPORTER_OTLP_ENDPOINT: url, OTEL_TRACES_SAMPLER_ARG: String(ratio) }
}

const KEY_SET_ISSUER = 'https://bench-issuer.invalid'
const KEY_SET_AUDIENCE = 'portfolio-gateway'
const KEY_SET_KID = 'bench-key-1'

/**
 * The key-set scenarios' identity provider: the tests' key server
 * (fixtures/key-server.ts) with one RS256 key, what most OpenID providers sign
 * with. It runs in the harness: the gateway fetches the set once and caches
 * it, so it serves a handful of requests per run.
 */
async function startBenchKeyServer (): Promise<KeyServer> {
  const server = await startKeyServer([['rsa', KEY_SET_KID]])
  server.cacheControl = 'max-age=300'
  return server
}

async function signKeySetToken (server: KeyServer, sub: string): Promise<string> {
  return await server.sign({ sub, iss: KEY_SET_ISSUER, aud: KEY_SET_AUDIENCE }, KEY_SET_KID)
}

function gatewaySpec (name: GatewayName): GatewaySpec {
  const spec = GATEWAYS[name]
  if (spec === undefined) throw new Error(`no gateway configuration named ${name}`)
  return spec
}

async function startConfiguredGateway (name: GatewayName, context: GatewayContext): Promise<Server> {
  const spec = gatewaySpec(name)
  // Without the key-set feature the production profile falls back to HS256 (and says so in the report).
  const keySet = spec.auth === 'keyset' && context.keyServer !== null
  return await startGateway({
    ...(spec.script === undefined ? {} : { script: spec.script }),
    ...(spec.node === undefined ? {} : { node: spec.node }),
    upstreamUrl:
      spec.engines === 2 && context.secondUpstreamUrl !== undefined
        ? `${context.upstreamUrl},${context.secondUpstreamUrl}`
        : context.upstreamUrl,
    ...(keySet ? {} : { jwtSecret: context.secret }),
    logLevel: spec.logLevel,
    env: { ...(await gatewayEnv(spec, context)), ...(spec.everythingOn === true ? context.prodEnv : {}) },
    label: name,
    ...(context.profileDir !== undefined ? { nodeArgs: profileArgs(context.profileDir, name) } : {})
  })
}

const profileArgs = (dir: string, name: string): string[] => ['--cpu-prof', `--cpu-prof-dir=${path.join(dir, name)}`]

/** Why a scenario cannot run here, or undefined when it can. */
function skipReason (s: Scenario, local: boolean, missing: Missing): string | undefined {
  if (!local && s.localOnly) return 'needs the local mock; not available with --target'
  const spec = isGateway(s.target) ? gatewaySpec(s.target) : undefined
  const needs = [...(spec?.needs ?? []), ...(s.needs ?? [])]
  // The production profile runs with whatever features this build has, and says which are missing.
  if (s.target === 'gateway-prod') return undefined
  if (s.target === 'gateway-prod-redis') return whyUnavailable(['redis', 'rate-limit'], missing)
  return whyUnavailable(needs, missing)
}

/** The features the everything-on gateway lacks in this build: shown beside its figures. */
function productionGaps (missing: Missing): string[] {
  return gatewaySpec('gateway-prod').needs.filter((f) => missing.has(f))
}

/**
 * A fixed arrival rate at multiples of the capacity just
 * measured, on the same gateway and request. Reports goodput (2xx per
 * second), the p99 of the accepted (2xx) answers, and the shares refused
 * with 503 (shed) or 429 (limited).
 */
async function saturation (
  target: Measured,
  request: BuiltRequest,
  capacity: number,
  options: Options
): Promise<SaturationPoint[]> {
  const points: SaturationPoint[] = []
  // Unmeasured: opens the connections and lets the generator's own code warm up before the first step.
  if (options.warmup > 0) {
    await openLoop(
      target.url,
      request,
      Math.max(1, Math.round(capacity * 0.5)),
      options.warmup,
      options.saturationConnections
    )
  }
  for (const multiple of SATURATION_MULTIPLES) {
    const offered = Math.max(1, Math.round(capacity * multiple))
    process.stderr.write(`saturation: ${multiple} x capacity = ${offered} req/s offered...`)
    const run = await openLoop(target.url, request, offered, options.duration, options.saturationConnections)
    const codes = run.statusCodes
    const answered = answeredOf(run)
    const share = (n: number): number => (answered === 0 ? Number.NaN : Math.round((n / answered) * 10000) / 10000)
    const ok = run.accepted.length
    const point: SaturationPoint = {
      multiple,
      offeredRps: offered,
      // Over the time until the last answer: a server that falls behind is still answering after the offer stops.
      answeredRps: Math.round(answered / run.elapsedS),
      goodputRps: Math.round(ok / run.elapsedS),
      p50Accepted: quantile(run.accepted, 0.5),
      p99Accepted: quantile(run.accepted, 0.99),
      shedShare: share(codes['503'] ?? 0),
      limitedShare: share(codes['429'] ?? 0),
      otherNon2xx: answered - ok - (codes['503'] ?? 0) - (codes['429'] ?? 0),
      errors: run.errors,
      notSent: run.notSent,
      statusCodes: codes
    }
    points.push(point)
    process.stderr.write(
      ` goodput ${point.goodputRps} req/s, p99 accepted ${point.p99Accepted} ms, shed ${point.shedShare}, limited ${point.limitedShare}\n`
    )
  }
  return points
}

async function main (): Promise<void> {
  const options = parseOptions(process.argv.slice(2))
  // The 1-minute load average before and after: on a shared machine it tells whether a run was disturbed.
  const loadBefore = loadavg()[0] ?? Number.NaN
  const local = options.target === undefined
  const wanted = (s: Scenario): boolean =>
    options.only.length > 0 ? options.only.includes(s.name) : !(s.explicitWithTarget === true && !local)
  const byRuntime = options.runtimes.length > 0
  const all = byRuntime
    ? withRuntimes(SCENARIOS.filter(wanted), options.runtimes)
    : withTwins(SCENARIOS, options.compare)
  for (const r of options.runtimes) {
    for (const name of Object.keys(GATEWAYS).filter((g) => !g.includes('@'))) {
      const script = path.join(r.dist, 'src', 'server.js')
      GATEWAYS[`${name}@${r.label}`] = { ...gatewaySpec(name), script, node: r.node }
    }
  }
  const twinWanted = (s: Scenario): boolean =>
    s.name.endsWith(BEFORE) && options.only.includes(s.name.slice(0, -BEFORE.length))
  const selected = byRuntime ? all : all.filter((s) => wanted(s) || twinWanted(s))
  // The open-loop parts compare the bare proxy with the everything-on gateway of one build: not by runtime.
  const wantSaturation = local && !byRuntime && (options.only.length === 0 || options.only.includes(SATURATION))
  const saturationBase = wantSaturation
    ? (selected.find((s) => s.name === 'prod-ping') ?? SCENARIOS.find((s) => s.name === 'prod-ping')!)
    : undefined
  // The latency pair runs whenever both of its scenarios do (or when named).
  const wantLatency =
    local &&
    (options.only.length === 0 || options.only.includes(LATENCY)) &&
    LATENCY_PAIR.every((name) => selected.some((s) => s.name === name))

  const missing = await detectFeatures(path.dirname(path.dirname(GATEWAY_SCRIPT)))
  const skipped = new Map<string, string>()
  for (const s of selected) {
    const reason = skipReason(s, local, missing)
    if (reason !== undefined) skipped.set(s.name, reason)
  }
  const needs = (target: TargetName): boolean =>
    local && (selected.some((s) => s.target === target && !skipped.has(s.name)) || saturationBase?.target === target)
  if (needs('nginx') && !existsSync(NGINX_BINARY)) skipped.set('nginx', `${NGINX_BINARY} not installed`)
  const gatewaysNeeded = Object.keys(GATEWAYS).filter(needs)
  if (gatewaysNeeded.length > 0 && !existsSync(GATEWAY_SCRIPT)) {
    throw new Error(`${GATEWAY_SCRIPT} does not exist: run \`npm run build\` (or use --only direct,nginx)`)
  }

  // Locally the harness picks the gateway's secret; against --target it can only use the operator's.
  const envSecret = process.env.JWT_SECRET
  const secret = !local && envSecret !== undefined && envSecret !== '' ? envSecret : randomSecret()
  const token = options.token ?? mintToken(secret)
  if (!local && options.token === undefined && secret !== envSecret) {
    process.stderr.write(
      'warning: --target without --token or $JWT_SECRET: the token is signed with a random secret and will be refused\n'
    )
  }

  // Start everything first: idle servers cost nothing, and no scenario pays for another's startup.
  const mock = local ? await startMock() : null
  const servers = new Map<TargetName, Server>()
  if (mock !== null) servers.set('mock', mock)
  if (mock !== null && needs('nginx') && !skipped.has('nginx')) servers.set('nginx', await startNginx(mock.url))
  const specs = gatewaysNeeded.map(gatewaySpec)
  const keySet = specs.some((g) => g.auth === 'keyset') && !missing.has('jwks')
  const keyServer = keySet ? await startBenchKeyServer() : null
  const redis = specs.some((g) => g.rateLimit === 'redis') && !missing.has('redis') ? await startRedis() : null
  const redisCluster =
    specs.some((g) => g.rateLimit === 'redis-cluster') && !missing.has('redis-cluster')
      ? await startRedisCluster()
      : null
  const keySetToken = keyServer === null ? null : await signKeySetToken(keyServer, 'bench-user')
  const tokenFor = (target: TargetName): string =>
    isGateway(target) && gatewaySpec(target).auth === 'keyset' && keySetToken !== null ? keySetToken : token
  // A second mock engine for the gateways that spread over two.
  const mock2 = mock !== null && specs.some((g) => g.engines === 2) ? await startMock() : null
  if (mock !== null && needs('bare')) {
    servers.set(
      'bare',
      await startBareProxy(mock.url, secret, options.profile === undefined ? [] : profileArgs(options.profile, 'bare'))
    )
  }
  if (mock !== null && needs('bare-fastify')) {
    servers.set(
      'bare-fastify',
      await startBareProxy(
        mock.url,
        secret,
        options.profile === undefined ? [] : profileArgs(options.profile, 'bare-fastify'),
        true
      )
    )
  }
  for (const r of mock === null ? [] : options.runtimes) {
    for (const [bare, fastify] of [
      ['bare', false],
      ['bare-fastify', true]
    ] as const) {
      const target = `${bare}@${r.label}`
      const runtime = { node: r.node, script: path.join(r.dist, 'bench', 'bare-proxy.js') }
      const nodeArgs = options.profile === undefined ? [] : profileArgs(options.profile, target)
      if (needs(target)) servers.set(target, await startBareProxy(mock!.url, secret, nodeArgs, fastify, runtime))
    }
  }
  if (mock !== null) {
    const context: GatewayContext = {
      upstreamUrl: mock.url,
      ...(mock2 === null ? {} : { secondUpstreamUrl: mock2.url }),
      secret,
      keyServer,
      redis,
      redisCluster,
      prodEnv: options.prodEnv,
      shedDelayMs: options.shedDelayMs,
      ...(options.profile === undefined ? {} : { profileDir: options.profile })
    }
    // In parallel: nine gateways one after another take seconds of start-up on a busy machine.
    await Promise.all(
      gatewaysNeeded.map(async (name) => {
        try {
          servers.set(name, await startConfiguredGateway(name, context))
        } catch (err) {
          // A configuration this build refuses (a feature half-landed) skips its scenarios, with the gateway's words.
          const reason = `${name} did not start: ${(err instanceof Error ? err.message : String(err)).split('\n').slice(0, 3).join(' | ')}`
          for (const s of selected) if (s.target === name) skipped.set(s.name, reason)
          process.stderr.write(`${reason}\n`)
        }
      })
    )
  }
  const targetOf = (s: Scenario): Measured => {
    const server = servers.get(s.target) ?? null
    return { server, url: server?.url ?? options.target ?? '' }
  }

  const runnable = selected.filter((s) => !skipped.has(s.name))
  const gatewayUrl = local ? (servers.get('gateway')?.url ?? servers.get('gateway-prod')?.url) : options.target
  const setupToken = local && servers.get('gateway') === undefined ? tokenFor('gateway-prod') : token
  const setup =
    runnable.some((s) => s.path.endsWith('/update')) && gatewayUrl !== undefined
      ? await setupPortfolio(gatewayUrl, setupToken)
      : { context: { portfolioId: 'bench-portfolio' } }
  if (setup.note !== undefined) process.stderr.write(`note: ${setup.note}\n`)

  const requests = new Map(
    runnable.map((s) => {
      const request = buildRequest(s, tokenFor(s.target), setup.context)
      // Local HS256 gateways only (localOnly scenarios): the harness knows their secret.
      if (s.users !== undefined) {
        request.rotate = Array.from({ length: s.users }, (_, i) => ({
          authorization: `Bearer ${mintToken(secret, `bench-user-${i}`)}`
        }))
      }
      return [s.name, request]
    })
  )
  const probes = new Map<string, Probe>()
  for (const s of runnable) {
    const target = targetOf(s)
    const request = requests.get(s.name)!
    probes.set(
      s.name,
      await probe(target.url, { ...request, headers: { ...request.headers, ...freshHeaders(request.fresh ?? []) } })
    )
  }

  const rounds = new Map<string, Round[]>(runnable.map((s) => [s.name, []]))
  // Every round in this order: each cost row beside a measurement of its base (bench/schedule.ts).
  const schedule = roundSchedule(runnable, options.rowsPerBase)
  const scheduleOf = (round: number): string[] =>
    byRuntime
      ? runtimeSchedule(
          runnable.map((s) => s.name),
          options.runtimes,
          round
        )
      : schedule
  // The 1-minute load average as each round began: on a shared machine, which rounds had neighbours.
  const roundLoads: number[] = []
  const byName = new Map(runnable.map((s) => [s.name, s]))
  const measured: Measurement[][] = []
  // Unmeasured load on a scenario's server: the settling below and each measurement's warm-up.
  const load = async (s: Scenario, seconds: number): ReturnType<typeof cannon> =>
    await cannon(
      targetOf(s).url,
      requests.get(s.name)!,
      s.connections?.(options.connections) ?? options.connections,
      seconds
    )
  // Once, before any round, the same seconds for every process, split among the scenarios it serves:
  // after 3 s of load a gateway still made some 160 optimisations in the next 8 s, its compiler
  // threads' CPU counted against its requests (docs/performance.md, "How the table is made").
  // What each process really got (autocannon's own clock), in the JSON report.
  const settled: Record<string, number> = {}
  for (const [target, scenarios] of settleShares(runnable, options.settle)) {
    for (const { scenario: s, seconds } of scenarios) {
      process.stderr.write(`settling ${s.name} on ${target} (${seconds.toFixed(2)} s)\n`)
      const { result } = await load(s, seconds)
      settled[target] = (settled[target] ?? 0) + result.duration
    }
  }
  for (let r = 1; r <= options.rounds; r++) {
    const sequence: Measurement[] = []
    const inRound = new Map<string, Round[]>()
    const order = scheduleOf(r)
    roundLoads.push(loadavg()[0] ?? Number.NaN)
    for (const [slot, name] of order.entries()) {
      const s = byName.get(name)!
      process.stderr.write(`round ${r}/${options.rounds}, ${slot + 1}/${order.length}: ${s.name}...`)
      // Warmed right before each measurement, not once at the start: a gateway that sat idle
      // through the other scenarios (a minute, in a full run) answers its first seconds
      // 15-25% slower (docs/performance-history.md, Method).
      if (options.warmup > 0) await load(s, options.warmup)
      const round = await measureRound(s, targetOf(s), mock, requests.get(s.name)!, options)
      sequence.push({ scenario: s.name, usPerRequest: round.cpu.serverUsPerRequest })
      inRound.set(s.name, [...(inRound.get(s.name) ?? []), round])
      process.stderr.write(` ${round.rps} req/s, p99 ${round.p99} ms, ${round.cpu.serverUsPerRequest} us/req\n`)
    }
    // A base measured several times in the round still gives one Round per round to the summary.
    for (const [name, list] of inRound) rounds.get(name)!.push(mergeRounds(list))
    measured.push(sequence)
  }

  // Past saturation: open loop at multiples of the capacity the closed loop just measured.
  let saturationReport:
    | {
      scenario: string
      capacityRps: number
      connections: number
      points: SaturationPoint[]
      verdict: ReturnType<typeof saturationVerdict>
    } |
    { skipped: string } |
    null = null
  if (saturationBase !== undefined) {
    const base = servers.has(saturationBase.target) ? saturationBase : SCENARIOS.find((s) => s.name === 'ping')!
    const measured = rounds.get(base.name)
    const capacity =
      measured !== undefined && measured.length > 0 ? Math.max(...measured.map((r) => r.rps)) : Number.NaN
    const target = targetOf(base)
    if (target.server === null || !Number.isFinite(capacity) || capacity <= 0) {
      saturationReport = { skipped: `needs a measured ${base.name} (run it in the same invocation)` }
    } else {
      // A user of its own: the closed-loop rounds have used much of bench-user's rate-limit window.
      const saturationToken =
        isGateway(base.target) && gatewaySpec(base.target).auth === 'keyset' && keyServer !== null
          ? await signKeySetToken(keyServer, 'bench-saturation')
          : mintToken(secret, 'bench-saturation')
      const request = buildRequest(base, saturationToken, setup.context)
      const points = await saturation(target, request, capacity, options)
      saturationReport = {
        scenario: base.name,
        capacityRps: capacity,
        connections: options.saturationConnections,
        points,
        verdict: saturationVerdict(points)
      }
    }
  }
  // Latency for phones: the bare proxy and the everything-on gateway at the same offered loads.
  let latencyReport: LatencyReport | { skipped: string } | null = null
  if (wantLatency) {
    const [bareName, prodName] = LATENCY_PAIR
    const measured = rounds.get(prodName)
    // Where the open loop's probe starts: the median closed-loop round (autocannon's).
    const closedLoopRps =
      measured !== undefined && measured.length > 0 ? median(measured.map((r) => r.rps)) : Number.NaN
    const pair = LATENCY_PAIR.map((name) => SCENARIOS.find((s) => s.name === name)!)
    if (pair.some((s) => !servers.has(s.target)) || !Number.isFinite(closedLoopRps) || closedLoopRps <= 0) {
      latencyReport = { skipped: `needs measured ${bareName} and ${prodName} (run them in the same invocation)` }
    } else {
      const points: LatencyPoint[] = []
      const tokenOf = async (s: Scenario): Promise<string> =>
        isGateway(s.target) && gatewaySpec(s.target).auth === 'keyset' && keyServer !== null
          ? await signKeySetToken(keyServer, 'bench-latency')
          : mintToken(secret, 'bench-latency')
      const requestsOf = new Map(
        await Promise.all(pair.map(async (s) => [s.name, buildRequest(s, await tokenOf(s), setup.context)] as const))
      )
      if (options.warmup > 0) {
        for (const s of pair) {
          await openLoop(
            targetOf(s).url,
            requestsOf.get(s.name)!,
            Math.max(1, Math.round(closedLoopRps * 0.5)),
            options.warmup,
            options.saturationConnections
          )
        }
      }
      // The capacity the offered loads are multiples of is measured with this
      // generator, in the open loop: the closed loop's autocannon costs the
      // shared cores less per request than the open loop's generator, so 90%
      // of its rate overloads the gateway, and p99 then measures a growing
      // queue, not the gateway. The offer steps up until a step is not
      // answered in full (every answer 2xx, none unsent, 2xx per second at
      // least 97% of the offer): the capacity is the last step that was.
      const prod = pair[1]!
      const prodPids = (await targetOf(prod).server?.pids()) ?? []
      const capacitySteps: CapacityStep[] = []
      for (
        let offered = Math.max(1, Math.round(closedLoopRps * CAPACITY_START));
        capacitySteps.length < options.capacitySteps;
        offered = Math.max(offered + 1, Math.round(offered * CAPACITY_STEP))
      ) {
        process.stderr.write(`latency: ${prod.name}'s capacity in the open loop, ${offered} req/s offered...`)
        const [serverBefore, ownBefore] = [await cpuSeconds(prodPids), process.cpuUsage()]
        const run = await openLoop(
          targetOf(prod).url,
          requestsOf.get(prod.name)!,
          offered,
          options.duration,
          options.saturationConnections
        )
        const [serverAfter, own] = [await cpuSeconds(prodPids), process.cpuUsage(ownBefore)]
        const busy = (seconds: number): number => Math.round((seconds / run.elapsedS) * 100) / 100
        const answered = answeredOf(run)
        const step = {
          offeredRps: offered,
          goodputRps: Math.round(run.accepted.length / run.elapsedS),
          non2xx: answered - run.accepted.length,
          errors: run.errors + run.notSent,
          p99: quantile(run.latencies, 0.99),
          cpu: {
            server: busy(serverAfter.user + serverAfter.system - serverBefore.user - serverBefore.system),
            generator: busy((own.user + own.system) / 1e6)
          }
        }
        const sustained = isSustained(step)
        capacitySteps.push({ ...step, sustained })
        process.stderr.write(
          ` 2xx ${step.goodputRps}/s, non-2xx ${step.non2xx}, p99 ${step.p99} ms, CPU gateway ${step.cpu.server} generator ${step.cpu.generator}\n`
        )
        if (!sustained) break
      }
      const found = capacityOf(capacitySteps)
      if (found.rps === null) {
        latencyReport = {
          skipped: `${prod.name} did not answer the search's first step in full (${capacitySteps[0]!.offeredRps} req/s offered): no capacity to take multiples of`
        }
      } else {
        const capacity = found.rps
        // Interleaved like the rounds: each offered load on one, then the other.
        for (const multiple of LATENCY_MULTIPLES) {
          for (const s of pair) {
            const offered = Math.max(1, Math.round(capacity * multiple))
            process.stderr.write(`latency: ${s.name} at ${multiple} x ${prodName}'s capacity = ${offered} req/s...`)
            const run = await openLoop(
              targetOf(s).url,
              requestsOf.get(s.name)!,
              offered,
              options.duration,
              options.saturationConnections
            )
            const answered = answeredOf(run)
            const point: LatencyPoint = {
              scenario: s.name,
              multiple,
              offeredRps: offered,
              p50: quantile(run.latencies, 0.5),
              p99: quantile(run.latencies, 0.99),
              non2xx: answered - run.accepted.length,
              errors: run.errors + run.notSent
            }
            points.push(point)
            process.stderr.write(` p50 ${point.p50} ms, p99 ${point.p99} ms\n`)
          }
        }
        latencyReport = {
          capacityFrom: prodName,
          capacityRps: capacity,
          capacityBounded: found.bounded,
          closedLoopRps: Math.round(closedLoopRps),
          capacitySteps,
          baseline: bareName,
          points,
          verdict: latencyVerdict(points, bareName, prodName)
        }
      }
    }
  }
  const runtimeOriginals = [...new Set(runnable.map((s) => s.name.slice(0, s.name.lastIndexOf('@'))))]
  const runtimeRows = byRuntime ? runtimeTable(runtimeOriginals, options.runtimes, measured) : []
  const keySetFetches = keyServer?.fetches ?? null
  await keyServer?.close()
  await stopAll()

  const scenarios: Record<string, ScenarioSummary> = {}
  const gaps = productionGaps(missing)
  for (const s of selected) {
    const connections = s.connections?.(options.connections) ?? options.connections
    const reason = skipped.get(s.name)
    const description =
      s.target.startsWith('gateway-prod') && gaps.length > 0
        ? `${s.description} [not in this build: ${gaps.join(', ')}]`
        : s.description
    scenarios[s.name] =
      reason !== undefined
        ? skippedSummary(description, connections, reason)
        : summarize(description, targetOf(s).url + s.path, connections, rounds.get(s.name)!, probes.get(s.name) ?? null)
  }
  const report = {
    machine: machineReport(loadBefore),
    options: {
      duration: options.duration,
      connections: options.connections,
      rounds: options.rounds,
      rowsPerBase: options.rowsPerBase,
      warmup: options.warmup,
      settle: options.settle,
      only: options.only,
      target: options.target ?? null,
      saturationConnections: options.saturationConnections,
      capacitySteps: options.capacitySteps,
      shedDelayMs: options.shedDelayMs,
      prodEnv: options.prodEnv
    },
    features: Object.fromEntries([...missing].map(([feature, why]) => [feature, `missing: ${why}`])),
    keySetFetches,
    scenarios,
    ratios: ratios(scenarios),
    // The order of each round's measurements, and what each measured: the cost table's ratios are read from these.
    schedule: { rowsPerBase: options.rowsPerBase, order: byRuntime ? null : schedule, rounds: measured },
    roundLoads: roundLoads.map((l) => Math.round(l * 100) / 100),
    runtimes: byRuntime ? { runtimes: options.runtimes, rows: runtimeRows } : null,
    // Seconds of unmeasured load each server process got before round 1 (--settle), as autocannon timed it.
    settled,
    costs: costTable(all, scenarios, measured),
    latency: latencyReport,
    saturation: saturationReport
  }

  const { duration, connections } = options
  process.stdout.write(
    `\n${report.machine.cpus} cpus, node ${report.machine.node}, ${duration} s x ${options.rounds} rounds, ${connections} connections, median of rounds, ` +
      `load average ${report.machine.loadavg1m.before.toFixed(2)} -> ${report.machine.loadavg1m.after.toFixed(2)}\n\n`
  )
  process.stdout.write(
    `${formatTable(scenarios)}\n\ncpu: cores busy during the run (server under test / mock upstream / this load generator); srv us/req: server CPU time per request; sys: kernel share of it\n${byRuntime ? '' : `\n${formatRatios(report.ratios)}\n`}`
  )
  if (saturationReport !== null) {
    process.stdout.write(
      'skipped' in saturationReport
        ? `\nsaturation: skipped: ${saturationReport.skipped}\n`
        : `\n${formatSaturation(saturationReport.scenario, saturationReport.capacityRps, saturationReport.connections, saturationReport.points, saturationReport.verdict)}\n`
    )
  }
  if (byRuntime) {
    const used = options.runtimes.map((r) => `${r.label}=${r.node} (${r.dist})`).join(', ')
    process.stdout.write(
      `\n${formatRuntimeMarkdown(runtimeRows, options.runtimes)}\n\nruntimes: ${used}\n` +
        `load average (1 min) at each round's start: ${report.roundLoads.join(', ')}\n`
    )
  } else process.stdout.write(`\n${formatCosts(report.costs)}\n`)
  if (latencyReport !== null) {
    process.stdout.write(
      'skipped' in latencyReport
        ? `\nlatency: skipped: ${latencyReport.skipped}\n`
        : `\n${formatLatency(latencyReport)}\n`
    )
  }
  if (missing.size > 0) {
    process.stdout.write(
      `\nfeatures not in this build:\n${[...missing].map(([f, why]) => `  ${f}: ${why}`).join('\n')}\n`
    )
  }
  const problems = formatProblems(scenarios)
  if (problems !== '') process.stdout.write(`\nproblems:\n${problems}\n`)
  if (options.json !== undefined) {
    await writeFile(options.json, `${JSON.stringify(report, null, 2)}\n`)
    process.stdout.write(`\nJSON written to ${options.json}\n`)
  }
  if (options.chart !== undefined) {
    await writeFile(
      options.chart,
      renderChart({
        title: `Portfolio Gateway, ${report.machine.date.slice(0, 10)}, ${report.machine.cpus} cpus, node ${report.machine.node}`,
        scenarios,
        saturation: saturationReport !== null && !('skipped' in saturationReport) ? saturationReport : null
      })
    )
    process.stdout.write(`chart written to ${options.chart}\n`)
  }
  const title = `Portfolio Gateway, ${report.machine.date.slice(0, 10)}, ${report.machine.cpus} cpus, node ${report.machine.node}`
  if (options.costChart !== undefined) {
    await writeFile(options.costChart, renderCostChart(title, report.costs))
    process.stdout.write(`cost chart written to ${options.costChart}\n`)
  }
  if (options.markdown !== undefined) {
    await writeMarkdown(options.markdown, {
      machine: report.machine,
      command: `npm run bench -- ${process.argv.slice(2).join(' ')}`,
      rounds: options.rounds,
      rowsPerBase: options.rowsPerBase,
      costs: report.costs,
      latency: latencyReport,
      ...(options.costChart === undefined
        ? {}
        : { chart: path.relative(path.dirname(options.markdown), options.costChart) })
    })
    process.stdout.write(`cost table written to ${options.markdown}\n`)
  }
}

process.once('exit', signalAll)
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    void stopAll().finally(() => process.exit(130))
  })
}

main().catch(async (err: unknown) => {
  process.stderr.write(`bench: ${err instanceof Error ? err.message : String(err)}\n`)
  await stopAll()
  process.exit(1)
})
