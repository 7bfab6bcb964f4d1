/**
 * The servers under test run as child processes, never in the harness: the
 * harness process is busy generating load, and anything sharing its event
 * loop would be measured together with autocannon's own overhead.
 */
import { execFile, spawn, type ChildProcess, type StdioOptions } from 'node:child_process'
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import { freePort } from '../deploy/local/parts.js'

/** dist/, the parent of dist/bench/ where this module runs from. */
const DIST = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
export const MOCK_SCRIPT = path.join(DIST, 'fixtures', 'mock-upstream.js')
export const BARE_PROXY_SCRIPT = path.join(DIST, 'bench', 'bare-proxy.js')
export const GATEWAY_SCRIPT = path.join(DIST, 'src', 'server.js')
export const ENGINE_SCRIPT = path.join(DIST, 'src', 'reference-engine', 'standalone.js')
export const NGINX_BINARY = '/usr/sbin/nginx'

export interface Server {
  name: string
  url: string
  /** The process ids whose CPU time counts as this server's (nginx: master and worker). */
  pids (): Promise<number[]>
  stop (): Promise<void>
}

const running = new Set<ChildProcess>()
/**
 * Gateways with nothing to write at exit: stopped with SIGKILL. A production
 * gateway announces its drain for 5 s before closing (src/server.ts), which a
 * benchmark need not wait for; a profiled one must exit by itself to write
 * its profile, so it is not in this set.
 */
const killable = new WeakSet<ChildProcess>()
/** Scratch directories (nginx config and temp files), removed by stopAll. */
const scratch = new Set<string>()

/**
 * Last resort on exit: 'exit' handlers cannot wait, so this only signals.
 * SIGTERM rather than SIGKILL, because a SIGKILLed nginx master leaves its
 * worker running.
 */
export function signalAll (): void {
  for (const child of running) if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM')
}

export async function stopAll (): Promise<void> {
  await Promise.all([...running].map(async (child) => await stopChild(child)))
  await Promise.all([...scratch].map(async (dir) => await rm(dir, { recursive: true, force: true })))
  scratch.clear()
}

// A production gateway announces its drain for 5 s before it closes (src/server.ts); 9 s lets it
// finish on its own, so a --cpu-prof profile gets written.
async function stopChild (child: ChildProcess, graceMs = 9000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  child.kill(killable.has(child) ? 'SIGKILL' : 'SIGTERM')
  // A gateway draining for shutdown may hold on to keep-alive sockets; do not wait forever.
  const timer = setTimeout(() => child.kill('SIGKILL'), graceMs)
  await exited
  clearTimeout(timer)
}

interface Launched {
  child: ChildProcess
  /** The last few KiB of the child's output, for error messages. */
  tail (): string
}

function launch (command: string, args: string[], env: NodeJS.ProcessEnv, stdout: 'pipe' | 'ignore'): Launched {
  const stdio: StdioOptions = ['ignore', stdout, 'pipe']
  const child = spawn(command, args, { env, stdio })
  running.add(child)
  child.once('exit', () => running.delete(child))
  let tail = ''
  const keep = (chunk: Buffer): void => { tail = (tail + chunk.toString('utf8')).slice(-4096) }
  child.stdout?.on('data', keep)
  child.stderr?.on('data', keep)
  return { child, tail: () => tail.trim() }
}

function exitedError (name: string, launched: Launched): Error {
  const { exitCode, signalCode } = launched.child
  return new Error(`${name} exited (${signalCode ?? `code ${String(exitCode)}`}) before it was ready:\n${launched.tail()}`)
}

/** One free loopback port, never the same twice in this process: the deployment recipe's own helper. */
export { freePort }

/** Poll `url` until it answers 200: the process may listen before it is ready. */
export async function waitForOk (url: string, timeoutMs: number, launched?: Launched, name = url): Promise<void> {
  const deadline = Date.now() + timeoutMs
  let last = 'no answer'
  while (Date.now() < deadline) {
    if (launched !== undefined && (launched.child.exitCode !== null || launched.child.signalCode !== null)) {
      throw exitedError(name, launched)
    }
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(1000) })
      await res.arrayBuffer()
      if (res.status === 200) return
      last = `HTTP ${res.status}`
    } catch (err) {
      last = err instanceof Error ? err.message : String(err)
    }
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
  throw new Error(`${name} not ready after ${timeoutMs} ms (last: ${last})${launched === undefined ? '' : `\n${launched.tail()}`}`)
}

function ownPids (child: ChildProcess): () => Promise<number[]> {
  return async () => child.pid === undefined ? [] : [child.pid, ...await descendants(child.pid)]
}

/** Resolves with the url of the child's `listening <url>` line. */
async function listeningUrl (launched: Launched, name: string): Promise<string> {
  return await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name} silent after 10 s:\n${launched.tail()}`)), 10_000)
    let seen = ''
    launched.child.stdout?.on('data', (chunk: Buffer) => {
      seen += chunk.toString('utf8')
      const match = /listening (\S+)/.exec(seen)
      if (match?.[1] !== undefined) {
        clearTimeout(timer)
        resolve(match[1])
      }
    })
    launched.child.once('exit', () => {
      clearTimeout(timer)
      reject(exitedError(name, launched))
    })
  })
}

/** Start fixtures/mock-upstream.js and wait for its `listening <url>` line. */
export async function startMock (): Promise<Server> {
  const launched = launch(process.execPath, [MOCK_SCRIPT, '--port', '0', '--host', '127.0.0.1'], process.env, 'pipe')
  const url = await listeningUrl(launched, 'mock upstream')
  return { name: 'mock', url, pids: ownPids(launched.child), stop: async () => await stopChild(launched.child) }
}

/**
 * The bare proxy (bench/bare-proxy.ts) in front of `upstreamUrl`, checking
 * HS256 tokens signed with `secret`: the baseline of every CPU ratio.
 */
export async function startBareProxy (
  upstreamUrl: string,
  secret: string,
  nodeArgs: string[] = [],
  fastify = false,
  runtime: { node?: string, script?: string } = {}
): Promise<Server> {
  const env: NodeJS.ProcessEnv = { ...process.env }
  delete env.NODE_OPTIONS
  const args = [
    ...nodeArgs, runtime.script ?? BARE_PROXY_SCRIPT, '--port', '0', '--host', '127.0.0.1', '--upstream', upstreamUrl,
    `--secret=${secret}`, ...(fastify ? ['--fastify'] : [])
  ]
  const launched = launch(runtime.node ?? process.execPath, args, env, 'pipe')
  const url = await listeningUrl(launched, fastify ? 'bare Fastify proxy' : 'bare proxy')
  return { name: fastify ? 'bare-fastify' : 'bare', url, pids: ownPids(launched.child), stop: async () => await stopChild(launched.child) }
}

export interface GatewayOptions {
  upstreamUrl: string
  /** HS256 secret; leave out when `env` configures another key source (JWT_JWKS_URL). */
  jwtSecret?: string
  logLevel: string
  /** Feature settings (RATE_LIMIT_PER_MINUTE, REDIS_URL, METRICS_PORT, ...), applied last. */
  env?: Record<string, string>
  /** Shown in messages; defaults to the log level. */
  label?: string
  /** Node flags, e.g. `--cpu-prof --cpu-prof-dir=DIR`. */
  nodeArgs?: string[]
  /** The gateway's entry point; default GATEWAY_SCRIPT (this build's). */
  script?: string
  /** The node binary; default the harness's own. */
  node?: string
}

/** Gateway settings that must come from the harness alone, never from the operator's shell. */
const INHERITED_SETTINGS = [
  'JWT_SECRET', 'JWT_PUBLIC_KEY', 'JWT_ISSUER', 'JWT_AUDIENCE', 'JWT_JWKS_URL', 'JWT_CLOCK_TOLERANCE_S', 'JWT_JWKS_COOLDOWN_S',
  'RATE_LIMIT_PER_MINUTE', 'REDIS_URL', 'IDEMPOTENCY_TTL_S', 'SHED_EVENT_LOOP_DELAY_MS', 'UPSTREAM_MAX_QUEUE',
  'METRICS_PORT', 'UPSTREAM_TIMEOUT_MS', 'NODE_OPTIONS',
  'REDIS_SENTINELS', 'REDIS_SENTINEL_NAME', 'REDIS_CLUSTER_NODES', 'REDIS_USERNAME', 'REDIS_PASSWORD', 'REDIS_SENTINEL_PASSWORD', 'REDIS_TLS_CA'
]

/**
 * Start `node dist/src/server.js` and wait for its liveness endpoint. With
 * LOG_LEVEL=info the per-request log lines go to /dev/null (stdio 'ignore'):
 * the gateway still formats and writes every line, as it would into a log
 * shipper's pipe, but the harness spends no CPU reading them.
 */
export async function startGateway (options: GatewayOptions): Promise<Server> {
  const port = await freePort()
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    NODE_ENV: 'production',
    HOST: '127.0.0.1',
    PORT: String(port),
    UPSTREAM_URL: options.upstreamUrl,
    LOG_LEVEL: options.logLevel
  }
  // Settings the operator's shell may carry would change what is measured.
  for (const name of INHERITED_SETTINGS) delete env[name]
  if (options.jwtSecret !== undefined) env.JWT_SECRET = options.jwtSecret
  // Metrics off unless the scenario gives them a port: the default 9464 may be held by another gateway.
  env.METRICS_PORT = '0'
  Object.assign(env, options.env ?? {})
  const stdout = options.logLevel === 'info' || options.logLevel === 'debug' || options.logLevel === 'trace' ? 'ignore' : 'pipe'
  const args = [...(options.nodeArgs ?? []), options.script ?? GATEWAY_SCRIPT]
  const launched = launch(options.node ?? process.execPath, args, env, stdout)
  // Workers: SIGTERM, which worker 0 forwards; a SIGKILLed worker 0 would leave its copies draining alone.
  const workers = Number(options.env?.GATEWAY_WORKERS ?? '1') > 1
  if ((options.nodeArgs === undefined || options.nodeArgs.length === 0) && !workers) killable.add(launched.child)
  const url = `http://127.0.0.1:${port}`
  const name = `gateway (${options.label ?? `LOG_LEVEL=${options.logLevel}`})`
  // Generous: on a shared machine several gateways start at once, each compiling its modules.
  await waitForOk(`${url}/health`, 60_000, launched, name)
  return { name, url, pids: ownPids(launched.child), stop: async () => await stopChild(launched.child) }
}

/**
 * The reference engine as its own process (`dist/src/reference-engine/standalone.js`),
 * storing images in a fresh temporary folder that stopAll (or stop) removes.
 * Its per-request info log goes to /dev/null, as the gateway's does at info.
 */
export async function startEngine (): Promise<Server & { imageDir: string }> {
  const port = await freePort()
  const imageDir = await mkdtemp(path.join(tmpdir(), 'bench-engine-images-'))
  scratch.add(imageDir)
  const env: NodeJS.ProcessEnv = { ...process.env, ENGINE_PORT: String(port), ENGINE_HOST: '127.0.0.1', ENGINE_IMAGE_DIR: imageDir }
  delete env.NODE_OPTIONS
  const launched = launch(process.execPath, [ENGINE_SCRIPT], env, 'ignore')
  const url = `http://127.0.0.1:${port}`
  await waitForOk(`${url}/health`, 20_000, launched, 'engine')
  return {
    name: 'engine',
    url,
    imageDir,
    pids: ownPids(launched.child),
    stop: async () => {
      await stopChild(launched.child)
      await rm(imageDir, { recursive: true, force: true })
      scratch.delete(imageDir)
    }
  }
}

/**
 * nginx with one worker proxying everything to the mock over a keep-alive
 * upstream pool: the reference point for "a proxy hop done well".
 * Client keep-alive is unlimited on both sides, as it is for the gateway
 * (Node does not cap requests per socket), so neither pays for reconnects.
 */
export interface NginxOptions {
  /**
   * Upload pass-through: bodies of any size streamed to the
   * upstream as they arrive (`proxy_request_buffering off`), as an operator
   * would put nginx in front of the engine. It validates nothing.
   */
  upload?: boolean
  /** Path that answers 200 once nginx and its upstream are up. */
  readyPath?: string
}

export async function startNginx (upstreamUrl: string, options: NginxOptions = {}): Promise<Server> {
  const upstream = new URL(upstreamUrl)
  const port = await freePort()
  const dir = await mkdtemp(path.join(tmpdir(), 'bench-nginx-'))
  scratch.add(dir)
  const uploads = options.upload === true ? '\n      client_max_body_size 0;\n      proxy_request_buffering off;' : ''
  const conf = `
worker_processes 1;
daemon off;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  upstream mock {
    server ${upstream.host};
    keepalive 64;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:${port};
    keepalive_requests 1000000;
    location / {
      proxy_pass http://mock;
      proxy_http_version 1.1;
      proxy_set_header Connection "";${uploads}
    }
  }
}
`
  const confPath = path.join(dir, 'nginx.conf')
  await writeFile(confPath, conf)
  // -e: without it nginx opens its default error log before reading the config.
  const launched = launch(NGINX_BINARY, ['-p', dir, '-e', `${dir}/error.log`, '-c', confPath], process.env, 'pipe')
  const url = `http://127.0.0.1:${port}`
  try {
    await waitForOk(`${url}${options.readyPath ?? '/api/portfolio/ping'}`, 10_000, launched, 'nginx')
  } catch (err) {
    const log = await readFile(path.join(dir, 'error.log'), 'utf8').catch(() => '')
    throw new Error(`${err instanceof Error ? err.message : String(err)}\n${log}`)
  }
  return {
    name: 'nginx',
    url,
    pids: ownPids(launched.child),
    stop: async () => {
      await stopChild(launched.child)
      await rm(dir, { recursive: true, force: true })
      scratch.delete(dir)
    }
  }
}

export const REDIS_BINARY = '/usr/bin/redis-server'

/**
 * Debian's redis-server on a free loopback port, nothing persisted (no RDB,
 * no AOF): the store behind the Redis rate-limit scenarios. Ready when it
 * prints "Ready to accept connections".
 */
export async function startRedis (): Promise<Server> {
  const port = await freePort()
  const dir = await mkdtemp(path.join(tmpdir(), 'bench-redis-'))
  scratch.add(dir)
  const launched = await launchRedisNode(['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir])
  return {
    name: 'redis',
    url: `redis://127.0.0.1:${port}`,
    pids: ownPids(launched.child),
    stop: async () => {
      await stopChild(launched.child)
      await rm(dir, { recursive: true, force: true })
      scratch.delete(dir)
    }
  }
}

export const REDIS_CLI_BINARY = '/usr/bin/redis-cli'

/** Start one redis-server with `args` and resolve once it says "Ready to accept connections". */
async function launchRedisNode (args: string[]): Promise<Launched> {
  const launched = launch(REDIS_BINARY, args, process.env, 'pipe')
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`redis-server not ready after 10 s:\n${launched.tail()}`)), 10_000)
    let seen = ''
    launched.child.stdout?.on('data', (chunk: Buffer) => {
      seen += chunk.toString('utf8')
      if (seen.includes('Ready to accept connections')) {
        clearTimeout(timer)
        resolve()
      }
    })
    launched.child.once('exit', () => {
      clearTimeout(timer)
      reject(exitedError('redis-server', launched))
    })
  })
  return launched
}

/**
 * Three redis-server primaries (no replicas) made a Redis Cluster by
 * `redis-cli --cluster create`, nothing persisted: the store behind
 * Ping-redis-cluster. Its `url` is REDIS_CLUSTER_NODES, the three
 * as host:port; its CPU is the three servers'. Ready once each node says
 * cluster_state:ok.
 */
export async function startRedisCluster (): Promise<Server> {
  const dir = await mkdtemp(path.join(tmpdir(), 'bench-redis-cluster-'))
  scratch.add(dir)
  const nodes = await Promise.all([0, 1, 2].map(async (i) => {
    // The bus port chosen free too: port + 10000 may be taken, or past 65535.
    const [port, bus] = [await freePort(), await freePort()]
    const launched = await launchRedisNode(['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir,
      '--dbfilename', `node-${i}.rdb`, '--cluster-enabled', 'yes', '--cluster-config-file', path.join(dir, `nodes-${i}.conf`), '--cluster-port', String(bus)])
    return { port, launched }
  }))
  const stop = async (): Promise<void> => {
    await Promise.all(nodes.map(async (n) => await stopChild(n.launched.child)))
    await rm(dir, { recursive: true, force: true })
    scratch.delete(dir)
  }
  const run = promisify(execFile)
  try {
    await run(REDIS_CLI_BINARY, ['--cluster', 'create', ...nodes.map((n) => `127.0.0.1:${n.port}`), '--cluster-yes'], { timeout: 30_000 })
    const deadline = Date.now() + 15_000
    for (const { port } of nodes) {
      while (!(await run(REDIS_CLI_BINARY, ['-p', String(port), 'cluster', 'info'])).stdout.includes('cluster_state:ok')) {
        if (Date.now() > deadline) throw new Error(`redis cluster node ${port}: no cluster_state:ok after 15 s`)
        await new Promise((resolve) => setTimeout(resolve, 100))
      }
    }
  } catch (err) {
    await stop()
    throw err
  }
  return {
    name: 'redis-cluster',
    url: nodes.map((n) => `127.0.0.1:${n.port}`).join(','),
    pids: async () => (await Promise.all(nodes.map(async (n) => await ownPids(n.launched.child)()))).flat(),
    stop
  }
}

/** Linux: a process's parent id, from /proc/<pid>/stat (fields after the `(comm)`). */
async function parentOf (pid: number): Promise<number | undefined> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8')
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    return Number(fields[1])
  } catch {
    return undefined
  }
}

async function descendants (root: number): Promise<number[]> {
  let entries: string[]
  try {
    entries = (await readdir('/proc')).filter((e) => /^\d+$/.test(e))
  } catch {
    return []
  }
  const parents = new Map<number, number>()
  await Promise.all(entries.map(async (e) => {
    const parent = await parentOf(Number(e))
    if (parent !== undefined) parents.set(Number(e), parent)
  }))
  const found: number[] = []
  const queue = [root]
  while (queue.length > 0) {
    const current = queue.shift()
    for (const [pid, parent] of parents) {
      if (parent === current) {
        found.push(pid)
        queue.push(pid)
      }
    }
  }
  return found
}

/** Linux clock ticks per second for /proc times (USER_HZ, 100 on every mainstream kernel). */
const USER_HZ = 100

export interface CpuTime {
  user: number
  system: number
}

/** CPU seconds used so far by these processes, split into user and kernel time; NaN where /proc is unavailable. */
export async function cpuSeconds (pids: number[]): Promise<CpuTime> {
  const total = { user: 0, system: 0 }
  for (const pid of pids) {
    try {
      const stat = await readFile(`/proc/${pid}/stat`, 'utf8')
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
      // utime and stime are fields 14 and 15 of stat(5); `fields` starts at field 3.
      total.user += Number(fields[11]) / USER_HZ
      total.system += Number(fields[12]) / USER_HZ
    } catch {
      return { user: Number.NaN, system: Number.NaN }
    }
  }
  return total
}

/**
 * Every optional feature off, whatever its default (rate limit 600/min and
 * metrics on :9464 once those land): the bare gateway the features are
 * measured against. A feature scenario overrides one of these.
 */
export const BARE_GATEWAY_ENV: Readonly<Record<string, string>> = Object.freeze({
  RATE_LIMIT_PER_MINUTE: '0',
  // The create scenarios are one user on 50 connections: the per-user upload cap
  // (DECISIONS 23) is a fairness limit, set out of reach like the rate limit.
  UPLOAD_MAX_PER_USER: '1000',
  METRICS_PORT: '0',
  SHED_EVENT_LOOP_DELAY_MS: '0'
})
