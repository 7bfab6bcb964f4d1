/**
 * Upload benchmarks of portfolio creation:
 *
 * - Upload time: 1 MiB and 10 MiB images, sequential creates straight to the
 *   reference engine, through nginx passing the body through unbuffered
 *   (`proxy_request_buffering off`, the fair anchor), and
 *   through the gateway, in the same run, rounds interleaved. Goals: gateway /
 *   nginx <= 1.15 at 10 MiB; gateway / direct <= 1.15 (the
 *   original goal, kept for comparison).
 * - Memory: the gateway's peak RSS growth under waves of concurrent 9 MiB
 *   uploads (16 by default, each on its own connection). Goal: < 80 MB.
 *
 * Both servers are child processes: the reference engine as a standalone
 * process storing images on disk (what "straight to the engine" means), and
 * the gateway with UPSTREAM_URL pointing at it.
 *
 *   node dist/bench/upload.js [--rounds 5] [--concurrency 16] [--json path]
 */
import { readdir, readFile, rm, writeFile } from 'node:fs/promises'
import { existsSync } from 'node:fs'
import { loadavg } from 'node:os'
import path from 'node:path'
import { Agent, Client, request, type Dispatcher } from 'undici'
import { createForm, mintToken, pngImage, type Multipart } from './payloads.js'
import {
  BARE_GATEWAY_ENV,
  ENGINE_SCRIPT,
  GATEWAY_SCRIPT,
  NGINX_BINARY,
  signalAll,
  startEngine,
  startGateway,
  startNginx,
  stopAll,
  type Server
} from './processes.js'
import { randomBytes } from 'node:crypto'
import { machineReport } from './report.js'

const MiB = 1024 * 1024
const UPLOAD_PATH = '/api/portfolio/create'
const TIME_GOAL = 1.15
const MEMORY_GOAL_MB = 80
const SIZES = [
  { label: '1 MiB', bytes: 1 * MiB },
  { label: '10 MiB', bytes: 10 * MiB }
] as const
const WAVE_IMAGE_BYTES = 9 * MiB
const SAMPLE_EVERY_MS = 20
const IDLE_BASELINE_MS = 1000

interface Options {
  rounds: number
  uploads: number
  warmup: number
  concurrency: number
  waves: number
  json?: string
}

const HELP = `usage: node dist/bench/upload.js [options]

  --rounds N        timing rounds, targets interleaved per round (default 5)
  --uploads N       sequential uploads per target, size and round (default 10)
  --warmup N        unmeasured uploads per target and size before round 1 (default 2)
  --concurrency N   concurrent 9 MiB uploads per memory wave, one connection each (default 16)
  --waves N         memory waves (default 3)
  --json PATH       also write the whole report as JSON
`

function parseOptions (argv: string[]): Options {
  const options: Options = { rounds: 5, uploads: 10, warmup: 2, concurrency: 16, waves: 3 }
  const count = (name: string, value: string | undefined, min: number): number => {
    const n = Number(value)
    if (!Number.isInteger(n) || n < min) throw new Error(`--${name} needs an integer >= ${min}, got ${String(value)}`)
    return n
  }
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]
    const value = argv[i + 1]
    switch (arg) {
      case '--rounds':
        options.rounds = count('rounds', value, 1)
        i++
        break
      case '--uploads':
        options.uploads = count('uploads', value, 1)
        i++
        break
      case '--warmup':
        options.warmup = count('warmup', value, 0)
        i++
        break
      case '--concurrency':
        options.concurrency = count('concurrency', value, 1)
        i++
        break
      case '--waves':
        options.waves = count('waves', value, 1)
        i++
        break
      case '--json':
        if (value === undefined || value.startsWith('--')) throw new Error('--json needs a path')
        options.json = value
        i++
        break
      case '--help':
      case '-h':
        process.stdout.write(HELP)
        process.exit(0)
        break
      default:
        throw new Error(`unknown option ${String(arg)}\n${HELP}`)
    }
  }
  return options
}

type TargetName = 'direct' | 'nginx' | 'gateway'

interface Target {
  name: TargetName
  server: Server
  headers: Record<string, string>
}

interface UploadResult {
  ms: number
  ok: boolean
  /** Status and the start of the body, for a failure. */
  detail: string
}

/** One create; the time runs from the first byte sent to the last byte of the answer. */
async function upload (target: Target, form: Multipart, dispatcher: Dispatcher): Promise<UploadResult> {
  const started = process.hrtime.bigint()
  try {
    const res = await request(`${target.server.url}${UPLOAD_PATH}`, {
      method: 'POST',
      dispatcher,
      headers: { ...target.headers, 'content-type': form.contentType, 'content-length': String(form.body.length) },
      body: form.body
    })
    const text = await res.body.text()
    const ms = Number(process.hrtime.bigint() - started) / 1e6
    let id: unknown
    try {
      id = (JSON.parse(text) as { portfolio_id?: unknown }).portfolio_id
    } catch {
      id = undefined
    }
    const ok = res.statusCode === 200 && typeof id === 'string' && id !== ''
    return { ms, ok, detail: ok ? '' : `HTTP ${res.statusCode} ${text.slice(0, 200)}` }
  } catch (err) {
    const ms = Number(process.hrtime.bigint() - started) / 1e6
    return {
      ms,
      ok: false,
      detail: err instanceof Error ? `${err.message} ${String(err.cause ?? '')}`.trim() : String(err)
    }
  }
}

function median (values: number[]): number {
  if (values.length === 0) return Number.NaN
  const sorted = [...values].sort((a, b) => a - b)
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

const round2 = (n: number): number => Math.round(n * 100) / 100
const round1 = (n: number): number => Math.round(n * 10) / 10

/** The engine keeps no use for stored images here; removing them between blocks keeps the disk small. */
async function clearImages (dir: string): Promise<void> {
  const names = await readdir(dir).catch(() => [] as string[])
  // Only final names (<uuid>.png); an upload in progress writes a dot file.
  await Promise.all(
    names.filter((n) => !n.startsWith('.')).map(async (n) => await rm(path.join(dir, n), { force: true }))
  )
}

// ---------------------------------------------------------------- upload time

interface TargetRound {
  medianMs: number
  minMs: number
  maxMs: number
  uploads: number
  failures: number
}

interface SizeResult {
  label: string
  bytes: number
  direct: { medianMs: number; rounds: TargetRound[] }
  gateway: { medianMs: number; rounds: TargetRound[] }
  /** null when nginx is not installed. */
  nginx: { medianMs: number; rounds: TargetRound[] } | null
  /** Median of all gateway uploads / median of all direct uploads. */
  ratio: number
  /** Median of all gateway uploads / median of all nginx uploads (the upload anchor). */
  nginxRatio: number | null
  nginxRoundRatios: number[]
  nginxGoal: string
  /** Judged at 10 MiB only; null for other sizes or without nginx. */
  nginxMet: boolean | null
  /** The same ratio per round, for the spread. */
  roundRatios: number[]
  goal: string
  met: boolean
  failures: number
  firstFailure: string | null
}

async function timeUploads (
  targets: Target[],
  agents: Map<TargetName, Agent>,
  imageDir: string,
  options: Options
): Promise<SizeResult[]> {
  const results: SizeResult[] = []
  const forms = SIZES.map((s) => createForm(pngImage(s.bytes)))
  const all = new Map<string, number[]>()
  const perRound = new Map<string, TargetRound[]>()
  const failures = new Map<string, number>()
  const firstFailure = new Map<string, string>()
  const key = (size: number, target: TargetName): string => `${size}:${target}`

  const block = async (sizeIndex: number, target: Target, n: number): Promise<{ times: number[]; failed: number }> => {
    const times: number[] = []
    let failed = 0
    for (let i = 0; i < n; i++) {
      const result = await upload(target, forms[sizeIndex]!, agents.get(target.name)!)
      if (result.ok) times.push(result.ms)
      else {
        failed++
        if (!firstFailure.has(String(sizeIndex))) { firstFailure.set(String(sizeIndex), `${target.name}: ${result.detail}`) }
      }
    }
    return { times, failed }
  }

  for (let s = 0; s < SIZES.length; s++) {
    for (const target of targets) {
      const warm = await block(s, target, options.warmup)
      if (warm.failed > 0) failures.set(key(s, target.name), (failures.get(key(s, target.name)) ?? 0) + warm.failed)
    }
  }
  await clearImages(imageDir)

  for (let r = 1; r <= options.rounds; r++) {
    for (let s = 0; s < SIZES.length; s++) {
      // A,B in odd rounds, B,A in even ones: neither target always runs right after the other.
      const order = r % 2 === 1 ? targets : [...targets].reverse()
      const line: string[] = []
      for (const target of order) {
        const { times, failed } = await block(s, target, options.uploads)
        const k = key(s, target.name)
        all.set(k, [...(all.get(k) ?? []), ...times])
        failures.set(k, (failures.get(k) ?? 0) + failed)
        const tr: TargetRound = {
          medianMs: round2(median(times)),
          minMs: round2(Math.min(...times)),
          maxMs: round2(Math.max(...times)),
          uploads: times.length,
          failures: failed
        }
        perRound.set(k, [...(perRound.get(k) ?? []), tr])
        line.push(`${target.name} ${tr.medianMs} ms${failed > 0 ? ` (${failed} failed)` : ''}`)
      }
      await clearImages(imageDir)
      process.stderr.write(`round ${r}/${options.rounds} ${SIZES[s]!.label}: ${line.join(', ')}\n`)
    }
  }

  for (let s = 0; s < SIZES.length; s++) {
    const direct = median(all.get(key(s, 'direct')) ?? [])
    const gateway = median(all.get(key(s, 'gateway')) ?? [])
    const ratio = round2(gateway / direct)
    const dRounds = perRound.get(key(s, 'direct')) ?? []
    const gRounds = perRound.get(key(s, 'gateway')) ?? []
    const failed = targets.reduce((n, t) => n + (failures.get(key(s, t.name)) ?? 0), 0)
    const hasNginx = targets.some((t) => t.name === 'nginx')
    const nginx = hasNginx ? median(all.get(key(s, 'nginx')) ?? []) : Number.NaN
    const nRounds = perRound.get(key(s, 'nginx')) ?? []
    const nginxRatio = hasNginx ? round2(gateway / nginx) : null
    results.push({
      label: SIZES[s]!.label,
      bytes: SIZES[s]!.bytes,
      direct: { medianMs: round2(direct), rounds: dRounds },
      gateway: { medianMs: round2(gateway), rounds: gRounds },
      nginx: hasNginx ? { medianMs: round2(nginx), rounds: nRounds } : null,
      ratio,
      nginxRatio,
      nginxRoundRatios: hasNginx
        ? gRounds.map((g, i) => round2(g.medianMs / (nRounds[i]?.medianMs ?? Number.NaN)))
        : [],
      nginxGoal: `<= ${TIME_GOAL} at 10 MiB`,
      nginxMet:
        nginxRatio === null || SIZES[s]!.bytes !== 10 * MiB
          ? null
          : Number.isFinite(nginxRatio) && nginxRatio <= TIME_GOAL && failed === 0,
      roundRatios: gRounds.map((g, i) => round2(g.medianMs / (dRounds[i]?.medianMs ?? Number.NaN))),
      goal: `<= ${TIME_GOAL}`,
      met: Number.isFinite(ratio) && ratio <= TIME_GOAL && failed === 0,
      failures: failed,
      firstFailure: firstFailure.get(String(s)) ?? null
    })
  }
  return results
}

// --------------------------------------------------------------------- memory

interface Status {
  /** kB, as /proc reports them. */
  rss: number
  hwm: number
}

async function readStatus (pid: number): Promise<Status> {
  const text = await readFile(`/proc/${pid}/status`, 'utf8')
  const field = (name: string): number =>
    Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? Number.NaN)
  return { rss: field('VmRSS'), hwm: field('VmHWM') }
}

/** Samples VmRSS of a few processes every SAMPLE_EVERY_MS until stopped. */
class RssSampler {
  readonly #pids: number[]
  readonly samples = new Map<number, number[]>()
  #timer: NodeJS.Timeout | undefined
  #last = 0
  maxGapMs = 0
  #reading = false

  constructor (pids: number[]) {
    this.#pids = pids
    for (const pid of pids) this.samples.set(pid, [])
  }

  start (): void {
    this.#last = performance.now()
    this.#timer = setInterval(() => {
      void this.#sample()
    }, SAMPLE_EVERY_MS)
    void this.#sample()
  }

  async #sample (): Promise<void> {
    if (this.#reading) return
    this.#reading = true
    const now = performance.now()
    this.maxGapMs = Math.max(this.maxGapMs, now - this.#last)
    this.#last = now
    try {
      await Promise.all(
        this.#pids.map(async (pid) => {
          const { rss } = await readStatus(pid)
          if (Number.isFinite(rss)) this.samples.get(pid)!.push(rss)
        })
      )
    } catch {
      /* a process gone: the run reports the failures */
    } finally {
      this.#reading = false
    }
  }

  async stop (): Promise<void> {
    clearInterval(this.#timer)
    await this.#sample()
  }

  /** Drop samples taken so far (the baseline is read separately). */
  reset (): void {
    for (const pid of this.#pids) this.samples.set(pid, [])
    this.maxGapMs = 0
    this.#last = performance.now()
  }
}

interface ProcessMemory {
  process: string
  /** MB (10^6 bytes) from here on. */
  baselineMb: number
  peakMb: number
  growthMb: number
  /** Peak growth per wave over the same baseline. */
  waveGrowthMb: number[]
  hwmBeforeMb: number
  hwmAfterMb: number
  samples: number
}

interface MemoryPhase {
  /** What the uploads went to. */
  via: TargetName
  concurrency: number
  waves: number
  imageBytes: number
  uploads: number
  failures: number
  firstFailure: string | null
  waveMs: number[]
  sampleEveryMs: number
  maxSampleGapMs: number
  processes: ProcessMemory[]
}

const kbToMb = (kb: number): number => round1((kb * 1024) / 1e6)

async function sleep (ms: number): Promise<void> {
  await new Promise((resolve) => setTimeout(resolve, ms))
}

/**
 * Baseline: median RSS over an idle second after a few warm-up uploads; then
 * `waves` waves of `concurrency` simultaneous uploads, each on its own
 * connection. Peak growth = highest sample during the waves - baseline.
 */
async function measureMemory (
  target: Target,
  watched: Array<{ name: string; pid: number }>,
  form: Multipart,
  imageDir: string,
  options: Options
): Promise<MemoryPhase> {
  let failures = 0
  let firstFailure: string | null = null
  const count = (r: UploadResult): void => {
    if (r.ok) return
    failures++
    firstFailure ??= `${target.name}: ${r.detail}`
  }

  // Warm-up: a few uploads, on fresh connections as the waves will use.
  for (let i = 0; i < 3; i++) {
    const client = new Client(target.server.url)
    count(await upload(target, form, client))
    await client.close()
  }
  await clearImages(imageDir)
  await sleep(200)

  const pids = watched.map((w) => w.pid)
  const before = new Map(await Promise.all(pids.map(async (pid) => [pid, await readStatus(pid)] as const)))
  const idle = new RssSampler(pids)
  idle.start()
  await sleep(IDLE_BASELINE_MS)
  await idle.stop()
  const baseline = new Map(pids.map((pid) => [pid, median(idle.samples.get(pid) ?? [])]))

  const sampler = new RssSampler(pids)
  const wavePeaks = new Map<number, number[]>(pids.map((pid) => [pid, []]))
  const waveMs: number[] = []
  sampler.start()
  for (let w = 0; w < options.waves; w++) {
    const mark = new Map(pids.map((pid) => [pid, sampler.samples.get(pid)!.length]))
    const clients = Array.from({ length: options.concurrency }, () => new Client(target.server.url))
    const started = performance.now()
    const results = await Promise.all(clients.map(async (client) => await upload(target, form, client)))
    waveMs.push(Math.round(performance.now() - started))
    results.forEach(count)
    await Promise.all(clients.map(async (c) => await c.close()))
    await sleep(100) // the answer leaves before every buffer is released: keep sampling a little
    for (const pid of pids) {
      const wave = sampler.samples.get(pid)!.slice(mark.get(pid))
      wavePeaks.get(pid)!.push(wave.length === 0 ? Number.NaN : Math.max(...wave))
    }
    await clearImages(imageDir)
  }
  await sampler.stop()
  const after = new Map(await Promise.all(pids.map(async (pid) => [pid, await readStatus(pid)] as const)))

  const processes = watched.map(({ name, pid }) => {
    const base = baseline.get(pid)!
    const all = sampler.samples.get(pid)!
    const peak = all.length === 0 ? Number.NaN : Math.max(...all)
    return {
      process: name,
      baselineMb: kbToMb(base),
      peakMb: kbToMb(peak),
      growthMb: kbToMb(peak - base),
      waveGrowthMb: wavePeaks.get(pid)!.map((p) => kbToMb(p - base)),
      hwmBeforeMb: kbToMb(before.get(pid)!.hwm),
      hwmAfterMb: kbToMb(after.get(pid)!.hwm),
      samples: all.length
    }
  })
  return {
    via: target.name,
    concurrency: options.concurrency,
    waves: options.waves,
    imageBytes: WAVE_IMAGE_BYTES,
    uploads: options.waves * options.concurrency,
    failures,
    firstFailure,
    waveMs,
    sampleEveryMs: SAMPLE_EVERY_MS,
    maxSampleGapMs: Math.round(sampler.maxGapMs),
    processes
  }
}

// --------------------------------------------------------------------- report

const pad = (s: string | number, n: number): string => String(s).padStart(n)
const verdict = (met: boolean): string => (met ? 'met' : 'NOT met')

function formatTime (sizes: SizeResult[], rounds: number, uploads: number): string {
  const lines = [
    `upload time: median ms per upload over ${rounds} rounds x ${uploads} sequential uploads per target (keep-alive)`,
    '',
    `size     ${pad('direct ms', 10)} ${pad('nginx ms', 9)} ${pad('gateway ms', 11)} ${pad('gw/direct', 9)} ${pad('gw/nginx', 9)}  per-round gw/nginx          failures`
  ]
  for (const s of sizes) {
    lines.push(
      `${s.label.padEnd(8)} ${pad(s.direct.medianMs.toFixed(2), 10)} ${pad(s.nginx?.medianMs.toFixed(2) ?? '-', 9)} ${pad(s.gateway.medianMs.toFixed(2), 11)} ` +
        `${pad(s.ratio.toFixed(2), 9)} ${pad(s.nginxRatio?.toFixed(2) ?? '-', 9)}  ${s.nginxRoundRatios
          .map((r) => r.toFixed(2))
          .join(' ')
          .padEnd(27)} ${pad(s.failures, 8)}`
    )
  }
  lines.push('', 'per round, median ms direct / nginx / gateway:')
  for (const s of sizes) {
    lines.push(
      `  ${s.label.padEnd(7)} ${s.direct.rounds.map((d, i) => `${d.medianMs.toFixed(1)}/${s.nginx?.rounds[i]?.medianMs.toFixed(1) ?? '-'}/${s.gateway.rounds[i]?.medianMs.toFixed(1) ?? '-'}`).join('  ')}`
    )
  }
  return lines.join('\n')
}

function formatMemory (phases: MemoryPhase[]): string {
  const lines = [
    `memory: ${phases[0]?.waves ?? 0} waves x ${phases[0]?.concurrency ?? 0} concurrent ${(WAVE_IMAGE_BYTES / MiB).toFixed(0)} MiB uploads, ` +
      `one connection each; RSS sampled every ${SAMPLE_EVERY_MS} ms; MB = 10^6 bytes`,
    '',
    'uploads to  process   baseline    peak  growth  per wave          VmHWM before/after  wave ms          failures'
  ]
  for (const phase of phases) {
    for (const p of phase.processes) {
      lines.push(
        `${phase.via.padEnd(11)} ${p.process.padEnd(8)} ${pad(p.baselineMb.toFixed(1), 9)} ${pad(p.peakMb.toFixed(1), 7)} ${pad(p.growthMb.toFixed(1), 7)}  ` +
          `${p.waveGrowthMb
            .map((g) => g.toFixed(1))
            .join(' ')
            .padEnd(17)} ${pad(`${p.hwmBeforeMb.toFixed(1)}/${p.hwmAfterMb.toFixed(1)}`, 18)}  ` +
          `${phase.waveMs.join(' ').padEnd(16)} ${pad(phase.failures, 8)}`
      )
    }
  }
  return lines.join('\n')
}

// ----------------------------------------------------------------------- main

async function main (): Promise<void> {
  const options = parseOptions(process.argv.slice(2))
  for (const file of [GATEWAY_SCRIPT, ENGINE_SCRIPT]) {
    if (!existsSync(file)) throw new Error(`${file} does not exist: run \`npm run build\` first`)
  }
  const loadBefore = loadavg()[0] ?? Number.NaN
  const secret = randomBytes(32).toString('hex')
  const engine = await startEngine()
  const gateway = await startGateway({
    upstreamUrl: engine.url,
    jwtSecret: secret,
    logLevel: 'warn',
    env: { ...BARE_GATEWAY_ENV }
  })
  const nginx = existsSync(NGINX_BINARY) ? await startNginx(engine.url, { upload: true, readyPath: '/health' }) : null
  if (nginx === null) process.stderr.write(`note: ${NGINX_BINARY} not installed: no gateway/nginx figures\n`)
  const enginePid = (await engine.pids())[0]
  const gatewayPid = (await gateway.pids())[0]
  if (enginePid === undefined || gatewayPid === undefined) { throw new Error('no process id for the engine or the gateway') }
  // RSS right after start, before any upload: the first few large uploads grow
  // the heap once (docs/performance-history.md, Uploads, Method: the warm-up uploads), which the waves' baseline
  // excludes.
  const atReady = {
    gatewayMb: kbToMb((await readStatus(gatewayPid)).rss),
    engineMb: kbToMb((await readStatus(enginePid)).rss)
  }

  const targets: Target[] = [
    { name: 'direct', server: engine, headers: { 'x-user-id': 'bench-user' } },
    // nginx checks nothing: the client sends the identity header the engine trusts, as with direct.
    ...(nginx === null ? [] : [{ name: 'nginx' as const, server: nginx, headers: { 'x-user-id': 'bench-user' } }]),
    { name: 'gateway', server: gateway, headers: { authorization: `Bearer ${mintToken(secret)}` } }
  ]

  // Memory first, on a gateway that has seen only a few uploads: the baseline
  // has not been inflated by earlier load, so the growth is the whole story.
  process.stderr.write('memory: uploads through the gateway...\n')
  const waveForm = createForm(pngImage(WAVE_IMAGE_BYTES))
  const viaGateway = await measureMemory(
    targets.find((t) => t.name === 'gateway')!,
    [
      { name: 'gateway', pid: gatewayPid },
      { name: 'engine', pid: enginePid }
    ],
    waveForm,
    engine.imageDir,
    options
  )
  process.stderr.write('memory: the same uploads straight to the engine (context)...\n')
  const direct = await measureMemory(
    targets[0]!,
    [{ name: 'engine', pid: enginePid }],
    waveForm,
    engine.imageDir,
    options
  )

  process.stderr.write('upload time...\n')
  const agents = new Map<TargetName, Agent>(
    targets.map((t) => [t.name, new Agent({ connections: 1, keepAliveTimeout: 60_000 })])
  )
  const sizes = await timeUploads(targets, agents, engine.imageDir, options)
  await Promise.all([...agents.values()].map(async (a) => await a.close()))
  await stopAll()

  const gw = viaGateway.processes.find((p) => p.process === 'gateway')!
  const memoryMet = gw.growthMb < MEMORY_GOAL_MB && viaGateway.failures === 0
  const report = {
    machine: machineReport(loadBefore),
    options: {
      rounds: options.rounds,
      uploads: options.uploads,
      warmup: options.warmup,
      concurrency: options.concurrency,
      waves: options.waves
    },
    uploadTime: sizes,
    memory: {
      goal: `gateway peak RSS growth < ${MEMORY_GOAL_MB} MB`,
      gatewayGrowthMb: gw.growthMb,
      met: memoryMet,
      atReady,
      /** The gateway's VmHWM at the end - its RSS at ready: growth since start, warm-up included (a ceiling). */
      gatewayHwmOverReadyMb: round1(gw.hwmAfterMb - atReady.gatewayMb),
      phases: [viaGateway, direct]
    }
  }

  const out = process.stdout
  out.write(
    `\n${report.machine.cpus} cpus, node ${report.machine.node}, load average ${loadBefore.toFixed(2)} -> ${report.machine.loadavg1m.after.toFixed(2)}\n\n`
  )
  out.write(`${formatTime(sizes, options.rounds, options.uploads)}\n\n${formatMemory(report.memory.phases)}\n\n`)
  for (const s of sizes) {
    out.write(
      `upload ${s.label.padEnd(7)} gateway/direct ${s.ratio.toFixed(2)}  goal <= ${TIME_GOAL}  (${verdict(s.met)})\n`
    )
  }
  for (const s of sizes) {
    out.write(
      `upload ${s.label.padEnd(7)} gateway/nginx  ${s.nginxRatio?.toFixed(2) ?? '-'}  ${s.nginxMet === null ? '(informational)' : `goal ${s.nginxGoal}  (${verdict(s.nginxMet)})`}\n`
    )
  }
  out.write(
    `memory         gateway peak RSS growth ${gw.growthMb.toFixed(1)} MB  goal < ${MEMORY_GOAL_MB} MB  (${verdict(memoryMet)}); ` +
      `since start: RSS at ready ${atReady.gatewayMb.toFixed(1)} MB, VmHWM ${gw.hwmAfterMb.toFixed(1)} MB (+${report.memory.gatewayHwmOverReadyMb.toFixed(1)})\n`
  )
  const problems = [
    ...sizes
      .filter((s) => s.failures > 0)
      .map((s) => `${s.label}: ${s.failures} failed uploads, first: ${s.firstFailure ?? '?'}`),
    ...report.memory.phases
      .filter((p) => p.failures > 0)
      .map((p) => `memory via ${p.via}: ${p.failures} failed uploads, first: ${p.firstFailure ?? '?'}`)
  ]
  if (problems.length > 0) out.write(`\nproblems:\n${problems.join('\n')}\n`)
  if (options.json !== undefined) {
    await writeFile(options.json, `${JSON.stringify(report, null, 2)}\n`)
    out.write(`\nJSON written to ${options.json}\n`)
  }
}

process.once('exit', signalAll)
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    void stopAll().finally(() => process.exit(130))
  })
}

main().catch(async (err: unknown) => {
  process.stderr.write(`bench upload: ${err instanceof Error ? err.message : String(err)}\n`)
  await stopAll()
  process.exit(1)
})
