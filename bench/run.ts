/**
 * Load-test harness: `npm run bench -- [options]`, see `--help`.
 *
 * Locally it starts the mock upstream, nginx (when installed) and two
 * gateways (LOG_LEVEL=warn and info) as child processes, then drives load at
 * each scenario in turn from this process. Rounds interleave the scenarios,
 * so slow drift on a shared machine hits all of them alike, and the report
 * takes the median of the rounds.
 */
import { existsSync } from 'node:fs'
import { writeFile } from 'node:fs/promises'
import { cpus, loadavg } from 'node:os'
import { parseArgs } from 'node:util'
import autocannon from 'autocannon'
import { mintToken, randomSecret } from './payloads.js'
import {
  cpuSeconds, GATEWAY_SCRIPT, NGINX_BINARY, signalAll, startGateway, startMock, startNginx, stopAll, type Server
} from './processes.js'
import { formatProblems, formatRatios, formatTable, ratios, skippedSummary, summarize, type Probe, type Round, type ScenarioSummary } from './report.js'
import { buildRequest, SCENARIOS, setupCreateRequest, type BuiltRequest, type RequestContext, type Scenario, type TargetName } from './scenarios.js'

const HELP = `usage: node dist/bench/run.js [options]
  --duration S      seconds per scenario per round (default 10)
  --connections N   concurrent connections (default 50; create-10mib uses at most 4)
  --rounds N        rounds; the report shows the median (default 2)
  --warmup S        seconds of unmeasured load per scenario before round 1 (default 1)
  --only a,b        scenarios to run: ${SCENARIOS.map((s) => s.name).join(', ')}
  --json PATH       also write the results as JSON
  --target URL      measure a running gateway instead of starting one (no direct/nginx/ping-logging;
                    create-10mib only when named in --only)
  --token JWT       bearer token for --target (default: minted from $JWT_SECRET)
`

interface Options {
  duration: number
  connections: number
  rounds: number
  warmup: number
  only: string[]
  json?: string
  target?: string
  token?: string
}

function parseOptions (argv: string[]): Options {
  const { values } = parseArgs({
    args: argv,
    options: {
      duration: { type: 'string', default: '10' },
      connections: { type: 'string', default: '50' },
      rounds: { type: 'string', default: '2' },
      warmup: { type: 'string', default: '1' },
      only: { type: 'string' },
      json: { type: 'string' },
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
    if (!Number.isFinite(n) || n < min || (integer && !Number.isInteger(n))) throw new Error(`--${name} ${text}: expected ${integer ? 'an integer' : 'a number'} >= ${min}`)
    return n
  }
  const only = values.only === undefined ? [] : values.only.split(',').map((s) => s.trim()).filter((s) => s !== '')
  const unknown = only.filter((name) => !SCENARIOS.some((s) => s.name === name))
  if (unknown.length > 0) throw new Error(`--only: unknown scenario ${unknown.join(', ')}; known: ${SCENARIOS.map((s) => s.name).join(', ')}`)
  return {
    duration: number('duration', values.duration, 0.1, false),
    connections: number('connections', values.connections, 1, true),
    rounds: number('rounds', values.rounds, 1, true),
    warmup: number('warmup', values.warmup, 0, false),
    only,
    ...(values.json === undefined ? {} : { json: values.json }),
    ...(values.target === undefined ? {} : { target: values.target.replace(/\/$/, '') }),
    ...(values.token === undefined ? {} : { token: values.token })
  }
}

interface LoadResult {
  result: autocannon.Result
  /** Every response's latency in ms, sorted. */
  latencies: Float64Array
}

/**
 * Run autocannon and keep every latency ourselves: autocannon's histogram
 * stores whole milliseconds, and on loopback most answers take less than one,
 * so its p50 would read 0 for every scenario.
 */
async function cannon (url: string, request: BuiltRequest, connections: number, duration: number): Promise<LoadResult> {
  let latencies = new Float64Array(1 << 16)
  let count = 0
  return await new Promise((resolve, reject) => {
    const instance = autocannon({
      url: url + request.path,
      method: request.method,
      headers: request.headers,
      ...(request.body === undefined ? {} : { body: request.body }),
      connections,
      duration
    }, (err, result) => {
      if (err !== null) reject(err)
      else resolve({ result, latencies: latencies.subarray(0, count).sort() })
    })
    instance.on('response', (_client, _status, _bytes, responseTime) => {
      if (count === latencies.length) {
        const grown = new Float64Array(latencies.length * 2)
        grown.set(latencies)
        latencies = grown
      }
      latencies[count++] = responseTime
    })
  })
}

/** The q-quantile (0..1) of sorted values, nearest rank, rounded to 0.01 ms. */
function quantile (sorted: Float64Array, q: number): number {
  if (sorted.length === 0) return Number.NaN
  const value = sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)] ?? Number.NaN
  return Math.round(value * 100) / 100
}

/** One request outside the load, to record what the server answers (and why, when it is not 2xx). */
async function probe (url: string, request: BuiltRequest): Promise<Probe> {
  try {
    const res = await fetch(url + request.path, {
      method: request.method,
      headers: request.headers,
      // fetch's types want an ArrayBuffer-backed view; a Buffer may sit on a shared pool.
      ...(request.body === undefined ? {} : { body: typeof request.body === 'string' ? request.body : Uint8Array.from(request.body) }),
      signal: AbortSignal.timeout(15_000)
    })
    return { status: res.status, body: (await res.text()).slice(0, 300) }
  } catch (err) {
    return { status: 0, body: err instanceof Error ? `${err.message} ${String(err.cause ?? '')}`.trim() : String(err) }
  }
}

/** A portfolio the bench user owns, so a real engine answers updates with 200 rather than 404. */
async function setupPortfolio (gatewayUrl: string, token: string): Promise<{ context: RequestContext, note?: string }> {
  const answer = await probe(gatewayUrl, setupCreateRequest(token))
  try {
    const id: unknown = (JSON.parse(answer.body) as { portfolio_id?: unknown }).portfolio_id
    if (answer.status === 200 && typeof id === 'string') return { context: { portfolioId: id } }
  } catch { /* not JSON: fall through */ }
  return {
    context: { portfolioId: 'bench-portfolio' },
    note: `setup create answered ${answer.status} ${answer.body.slice(0, 120)}; updates use the id "bench-portfolio"`
  }
}

interface Measured {
  server: Server | null
  url: string
}

async function measureRound (scenario: Scenario, target: Measured, mock: Server | null, request: BuiltRequest, options: Options): Promise<Round> {
  const connections = scenario.connections?.(options.connections) ?? options.connections
  const serverPids = await target.server?.pids() ?? []
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
      serverUsPerRequest: result.requests.total === 0 ? Number.NaN : Math.round((serverCpu * 1e6) / result.requests.total),
      serverSystemShare: serverCpu > 0 ? Math.round((serverSystem / serverCpu) * 100) / 100 : Number.NaN,
      mock: mockPids.length === 0 ? Number.NaN : busy(mockAfter.user + mockAfter.system - mockBefore.user - mockBefore.system),
      loadgen: busy((own.user + own.system) / 1e6)
    }
  }
}

async function main (): Promise<void> {
  const options = parseOptions(process.argv.slice(2))
  // The 1-minute load average before and after: on a shared machine it tells whether a run was disturbed.
  const loadBefore = loadavg()[0] ?? Number.NaN
  const local = options.target === undefined
  const wanted = (s: Scenario): boolean => options.only.length > 0 ? options.only.includes(s.name) : !(s.explicitWithTarget === true && !local)
  const selected = SCENARIOS.filter(wanted)
  const needs = (target: TargetName): boolean => local && selected.some((s) => s.target === target)

  const skipped = new Map<string, string>()
  if (!local) for (const s of selected) if (s.localOnly) skipped.set(s.name, 'needs the local mock; not available with --target')
  const nginxMissing = needs('nginx') && !existsSync(NGINX_BINARY)
  if (nginxMissing) skipped.set('nginx', `${NGINX_BINARY} not installed`)
  if ((needs('gateway') || needs('gateway-logging')) && !existsSync(GATEWAY_SCRIPT)) {
    throw new Error(`${GATEWAY_SCRIPT} does not exist: run \`npm run build\` (or use --only direct,nginx)`)
  }

  // Locally the harness picks the gateway's secret; against --target it can only use the operator's.
  const envSecret = process.env.JWT_SECRET
  const secret = !local && envSecret !== undefined && envSecret !== '' ? envSecret : randomSecret()
  const token = options.token ?? mintToken(secret)
  if (!local && options.token === undefined && secret !== envSecret) {
    process.stderr.write('warning: --target without --token or $JWT_SECRET: the token is signed with a random secret and will be refused\n')
  }

  // Start everything first: idle servers cost nothing, and no scenario pays for another's startup.
  const mock = local ? await startMock() : null
  const servers = new Map<TargetName, Server>()
  if (mock !== null) servers.set('mock', mock)
  if (mock !== null && needs('nginx') && !nginxMissing) servers.set('nginx', await startNginx(mock.url))
  if (mock !== null && needs('gateway')) servers.set('gateway', await startGateway({ upstreamUrl: mock.url, jwtSecret: secret, logLevel: 'warn' }))
  if (mock !== null && needs('gateway-logging')) servers.set('gateway-logging', await startGateway({ upstreamUrl: mock.url, jwtSecret: secret, logLevel: 'info' }))
  const targetOf = (s: Scenario): Measured => {
    const server = servers.get(s.target) ?? null
    return { server, url: server?.url ?? options.target ?? '' }
  }

  const runnable = selected.filter((s) => !skipped.has(s.name))
  const gatewayUrl = local ? servers.get('gateway')?.url : options.target
  const setup = runnable.some((s) => s.name === 'update') && gatewayUrl !== undefined
    ? await setupPortfolio(gatewayUrl, token)
    : { context: { portfolioId: 'bench-portfolio' } }
  if (setup.note !== undefined) process.stderr.write(`note: ${setup.note}\n`)

  const requests = new Map(runnable.map((s) => [s.name, buildRequest(s, token, setup.context)]))
  const probes = new Map<string, Probe>()
  for (const s of runnable) {
    const target = targetOf(s)
    probes.set(s.name, await probe(target.url, requests.get(s.name)!))
    if (options.warmup > 0) await cannon(target.url, requests.get(s.name)!, s.connections?.(options.connections) ?? options.connections, options.warmup)
  }

  const rounds = new Map<string, Round[]>(runnable.map((s) => [s.name, []]))
  for (let r = 1; r <= options.rounds; r++) {
    for (const s of runnable) {
      process.stderr.write(`round ${r}/${options.rounds}: ${s.name}...`)
      const round = await measureRound(s, targetOf(s), mock, requests.get(s.name)!, options)
      rounds.get(s.name)!.push(round)
      process.stderr.write(` ${round.rps} req/s, p99 ${round.p99} ms\n`)
    }
  }
  await stopAll()

  const scenarios: Record<string, ScenarioSummary> = {}
  for (const s of selected) {
    const connections = s.connections?.(options.connections) ?? options.connections
    const reason = skipped.get(s.name)
    scenarios[s.name] = reason !== undefined
      ? skippedSummary(s.description, connections, reason)
      : summarize(s.description, targetOf(s).url + s.path, connections, rounds.get(s.name)!, probes.get(s.name) ?? null)
  }
  const report = {
    machine: { cpus: cpus().length, cpuModel: cpus()[0]?.model ?? 'unknown', node: process.version, platform: process.platform, date: new Date().toISOString(),
      loadavg1m: { before: loadBefore, after: loadavg()[0] ?? Number.NaN } },
    options: { duration: options.duration, connections: options.connections, rounds: options.rounds, warmup: options.warmup, only: options.only, target: options.target ?? null },
    scenarios,
    ratios: ratios(scenarios)
  }

  const { duration, connections } = options
  process.stdout.write(`\n${report.machine.cpus} cpus, node ${report.machine.node}, ${duration} s x ${options.rounds} rounds, ${connections} connections, median of rounds, ` +
    `load average ${report.machine.loadavg1m.before.toFixed(2)} -> ${report.machine.loadavg1m.after.toFixed(2)}\n\n`)
  process.stdout.write(`${formatTable(scenarios)}\n\ncpu: cores busy during the run (server under test / mock upstream / this load generator); srv us/req: server CPU time per request; sys: kernel share of it\n\n${formatRatios(report.ratios)}\n`)
  const problems = formatProblems(scenarios)
  if (problems !== '') process.stdout.write(`\nproblems:\n${problems}\n`)
  if (options.json !== undefined) {
    await writeFile(options.json, `${JSON.stringify(report, null, 2)}\n`)
    process.stdout.write(`\nJSON written to ${options.json}\n`)
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
