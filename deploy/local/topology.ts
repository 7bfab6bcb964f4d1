/**
 * The whole topology on one machine, as processes:
 *
 *   clients --TLS 1.3, h2 or http/1.1--> haproxy --http/1.1--> gateway-1..3 --> engine-1, engine-2
 *                                                                 |                  |
 *                                       redis-primary + redis-replica        engine-redis (their own)
 *                                       watched by sentinel-1..3
 *   prometheus scrapes the gateways' METRICS_PORT and haproxy's exporter.
 *
 * One way to bring it up, for `npm run deploy:local` and for the chaos test:
 * startTopology() starts each part and waits until it serves, in the order
 * their dependencies need; the returned handle restarts, signals and stops
 * them. State lives in the run directory: pids.json, logs/, certificates,
 * the generated configs, and topology.json (ports and names, for --stop and
 * --bench).
 *
 * With `enginesByName` (the chaos test), the engines are found the way
 * Kubernetes' headless Service has gateways find them: each on an address of
 * its own (127.0.0.2, 127.0.0.3, ...) on one port, all behind one name that a
 * DNS server in this process answers (deploy/local/dns.ts), so a rollout can
 * give engines new addresses and take old ones away.
 */
import { createHmac, randomBytes } from 'node:crypto'
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { startDnsServer, type DnsServer } from './dns.js'
import { haproxySpec, type HaproxyEnv } from './haproxy.js'
import { freePort, httpStatus, PartSet, waitUntil, type PartSpec } from './parts.js'
import { prometheusSpec } from './prometheus.js'
import { redisServerSpec, SENTINEL_NAME, sentinelSpec, waitSentinelsFormed } from './redis.js'
import { makeCertificates } from './tls.js'

export const GATEWAYS = ['gateway-1', 'gateway-2', 'gateway-3'] as const
export const ENGINES = ['engine-1', 'engine-2'] as const
export const SENTINELS = ['sentinel-1', 'sentinel-2', 'sentinel-3'] as const
/** The engines' name with `enginesByName`: what the gateways' UPSTREAM_URL names and the topology's DNS server answers.
 *
 */
export const ENGINE_NAME = 'engines.local'
/**
 * How a stop goes: the balancer first, so nothing new arrives; then the
 * gateways and engines drain together (an engine serves through its notice
 * what a draining gateway still sends); the sentinels before the servers
 * they watch, so they start no failover; the stores last.
 */
export const STOP_WAVES = [
  ['haproxy'],
  [...GATEWAYS, ...ENGINES, 'prometheus'],
  [...SENTINELS],
  ['redis-replica', 'redis-primary', 'engine-redis']
]

export interface Ports {
  https: number
  /** With `enginesByName`: the topology's DNS server on 127.0.0.1 (UDP). */
  dns?: number
  haproxyAdmin: number
  prometheus: number
  gateways: number[]
  gatewayMetrics: number[]
  /** One port per engine on 127.0.0.1; with `enginesByName`, the one port every engine address shares. */
  engines: number[]
  redisPrimary: number
  redisReplica: number
  sentinels: number[]
  engineRedis: number
}

export interface TopologyOptions {
  runDir: string
  /** The repository: dist/ and deploy/ are read from it. */
  root: string
  /** Let the parts outlive this process (npm run deploy:local); the chaos test keeps them attached. */
  detached: boolean
  /** Consecutive ports from here (see allocatePorts); free ports when absent. */
  basePort?: number
  /** Added to every gateway's environment (the chaos test lifts the rate limit). */
  gatewayEnv?: Record<string, string>
  scrapeIntervalS?: number
  /**
   * Engines on 127.0.0.2, 127.0.0.3, ... on one port behind ENGINE_NAME, which
   * the gateways resolve with UPSTREAM_DNS_SERVERS at the topology's DNS
   * server, every 5 s (the default UPSTREAM_DNS_REFRESH_MS, as in production).
   * Needs Linux (all of 127.0.0.0/8 on loopback) and an attached topology:
   * the DNS server lives in the process that started it.
   */
  enginesByName?: boolean
  log?: (line: string) => void
}

/** One reference engine of the topology. */
export interface EngineRef {
  /** Its part's name: engine-1, engine-2, ... */
  part: string
  /** The address it listens on. */
  address: string
  /** http://address:port */
  url: string
}

/** ENGINE_NAME's addresses, as the topology's DNS server answers them from now on. */
export interface EngineNameRecords {
  name: string
  addresses: () => readonly string[]
  set: (addresses: readonly string[]) => void
}

export interface TopologyInfo {
  runDir: string
  url: string
  caFile: string
  ports: Ports
  secretFile: string
}

export interface Topology extends TopologyInfo {
  parts: PartSet
  jwtSecret: string
  /** Start a part again with its first specification, and wait until it serves. */
  restart: (name: string) => Promise<void>
  /** The engines whose process is running, oldest first. */
  engines: () => EngineRef[]
  /** `enginesByName` only: one more engine, on the next loopback address, serving (/health 200), not yet in the name.
   *
   */
  startEngine: () => Promise<EngineRef>
  /** `enginesByName` only: the engines' name in the topology's DNS server. */
  engineName?: EngineNameRecords
  stop: () => Promise<void>
}

/** Ports from `base`: the public and admin ones first, each group on its own ten. */
export function allocatePorts (base: number): Ports {
  return {
    https: base,
    haproxyAdmin: base + 1,
    prometheus: base + 2,
    gateways: [base + 10, base + 11, base + 12],
    gatewayMetrics: [base + 20, base + 21, base + 22],
    engines: [base + 30, base + 31],
    redisPrimary: base + 40,
    redisReplica: base + 41,
    sentinels: [base + 42, base + 43, base + 44],
    engineRedis: base + 45
  }
}

async function freePorts (): Promise<Ports> {
  const many = async (n: number): Promise<number[]> => await Promise.all(Array.from({ length: n }, freePort))
  const [single, gateways, gatewayMetrics, engines, sentinels] = await Promise.all([
    many(6),
    many(3),
    many(3),
    many(2),
    many(3)
  ])
  const [https, haproxyAdmin, prometheus, redisPrimary, redisReplica, engineRedis] = single as [
    number,
    number,
    number,
    number,
    number,
    number
  ]
  // freePort never hands out one port twice in a process: no two parts share one.
  return {
    https,
    haproxyAdmin,
    prometheus,
    gateways,
    gatewayMetrics,
    engines,
    redisPrimary,
    redisReplica,
    sentinels,
    engineRedis
  }
}

/** An HS256 token (RFC 7519) for `sub`, signed with the gateways' secret. */
export function mintToken (secret: string, sub: string, ttlS = 12 * 3600): string {
  const b64 = (v: unknown): string => Buffer.from(JSON.stringify(v)).toString('base64url')
  const now = Math.floor(Date.now() / 1000)
  const input = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64({ sub, iat: now, exp: now + ttlS })}`
  return `${input}.${createHmac('sha256', secret).update(input).digest('base64url')}`
}

function healthSpec (name: string, script: string, env: Record<string, string>, health: string): PartSpec {
  return {
    name,
    command: process.execPath,
    args: [script],
    env,
    ready: async () => await waitUntil(`${name} /health`, async () => (await httpStatus(health)) === 200)
  }
}

export function readTopologyInfo (runDir: string): TopologyInfo | undefined {
  const file = join(runDir, 'topology.json')
  return existsSync(file) ? (JSON.parse(readFileSync(file, 'utf8')) as TopologyInfo) : undefined
}

export async function startTopology (opts: TopologyOptions): Promise<Topology> {
  const log = opts.log ?? (() => {})
  const { runDir, root } = opts
  const byName = opts.enginesByName === true
  if (byName && opts.detached) { throw new Error('enginesByName needs an attached topology: its DNS server lives in this process') }
  mkdirSync(runDir, { recursive: true })
  const ports = opts.basePort === undefined ? await freePorts() : allocatePorts(opts.basePort)
  const dns: DnsServer | undefined = byName
    ? await startDnsServer({ port: opts.basePort === undefined ? 0 : opts.basePort + 32 })
    : undefined
  if (dns !== undefined) {
    ports.dns = dns.port
    ports.engines = ports.engines.slice(0, 1)
  }
  const parts = new PartSet(runDir, opts.detached)
  const host = (port: number): string => `127.0.0.1:${port}`

  // The gateways' HS256 secret, kept in the run directory (mode 600) so more tokens can be minted.
  const secretFile = join(runDir, 'jwt-secret')
  if (!existsSync(secretFile)) writeFileSync(secretFile, randomBytes(32).toString('hex'), { mode: 0o600 })
  const jwtSecret = readFileSync(secretFile, 'utf8').trim()
  const certs = makeCertificates(runDir)
  const imageDir = join(runDir, 'images')
  mkdirSync(imageDir, { recursive: true })

  const info: TopologyInfo = {
    runDir,
    url: `https://localhost:${ports.https}`,
    caFile: certs.caFile,
    ports,
    secretFile
  }
  writeFileSync(join(runDir, 'topology.json'), JSON.stringify(info, null, 2) + '\n')

  const engineScript = join(root, 'dist', 'src', 'reference-engine', 'standalone.js')
  const engines: EngineRef[] = []
  /** Engine n (from 1): by name, on 127.0.0.(n+1) and the shared port; else on 127.0.0.1 and its own port. */
  const startEngine = async (): Promise<EngineRef> => {
    const n = engines.length + 1
    if (!byName && n > ENGINES.length) { throw new Error('more engines need enginesByName: the engines share one port on addresses of their own') }
    const address = byName ? `127.0.0.${n + 1}` : '127.0.0.1'
    const port = byName ? ports.engines[0]! : ports.engines[n - 1]!
    const ref = { part: `engine-${n}`, address, url: `http://${address}:${port}` }
    engines.push(ref)
    await parts.start(
      healthSpec(
        ref.part,
        engineScript,
        {
          NODE_ENV: 'production', // the 5 s drain notice: never shorter than the gateways' health-check interval (DECISIONS 25)
          ENGINE_PORT: String(port),
          ENGINE_HOST: address,
          ENGINE_IMAGE_DIR: imageDir,
          ENGINE_REDIS_URL: `redis://${host(ports.engineRedis)}`
        },
        `${ref.url}/health`
      )
    )
    return ref
  }
  const running = (ref: EngineRef): boolean => {
    const proc = parts.parts.get(ref.part)?.proc
    return proc !== undefined && proc.exitCode === null && proc.signalCode === null
  }
  const engineName: EngineNameRecords | undefined =
    dns === undefined
      ? undefined
      : {
          name: ENGINE_NAME,
          addresses: () => dns.get(ENGINE_NAME) ?? [],
          set: (addresses) => {
            dns.set(ENGINE_NAME, addresses)
          }
        }

  const topology: Topology = {
    ...info,
    parts,
    jwtSecret,
    restart: async (name) => {
      await parts.restart(name)
    },
    engines: () => engines.filter(running),
    startEngine: async () => {
      if (!byName) throw new Error('startEngine needs enginesByName')
      return await startEngine()
    },
    ...(engineName === undefined ? {} : { engineName }),
    stop: async () => {
      // Engines started after the first two drain with the gateways, as engine-1 and engine-2 do.
      await parts.stopAll(
        STOP_WAVES.map((wave) =>
          wave.includes(ENGINES[0]) ? [...wave, ...engines.map((e) => e.part).filter((p) => !wave.includes(p))] : wave
        )
      )
      await dns?.close()
    }
  }
  try {
    log("redis: the engines' store, the gateways' primary and replica")
    await Promise.all([
      parts.start(redisServerSpec('engine-redis', ports.engineRedis, runDir)),
      parts.start(redisServerSpec('redis-primary', ports.redisPrimary, runDir))
    ])
    await parts.start(redisServerSpec('redis-replica', ports.redisReplica, runDir, ports.redisPrimary))
    log('redis-sentinel x3')
    await Promise.all(
      SENTINELS.map(
        async (name, i) => await parts.start(sentinelSpec(name, ports.sentinels[i]!, ports.redisPrimary, runDir))
      )
    )
    await waitSentinelsFormed(ports.sentinels)

    log(byName ? `reference engines x2, on 127.0.0.2 and 127.0.0.3 behind ${ENGINE_NAME}` : 'reference engines x2')
    await Promise.all(ENGINES.map(async () => await startEngine()))
    engineName?.set(engines.map((e) => e.address))

    log('gateways x3')
    const gatewayScript = join(root, 'dist', 'src', 'server.js')
    await Promise.all(
      GATEWAYS.map(
        async (name, i) =>
          await parts.start(
            healthSpec(
              name,
              gatewayScript,
              {
                NODE_ENV: 'production',
                PORT: String(ports.gateways[i]),
                HOST: '127.0.0.1',
                METRICS_PORT: String(ports.gatewayMetrics[i]),
                JWT_SECRET: jwtSecret,
                // By name: resolved at the topology's DNS server every 5 s (the default), as a headless Service is.
                ...(dns === undefined
                  ? { UPSTREAM_URL: ports.engines.map((p) => `http://${host(p)}`).join(',') }
                  : { UPSTREAM_URL: `http://${ENGINE_NAME}:${ports.engines[0]!}`, UPSTREAM_DNS_SERVERS: dns.address }),
                REDIS_SENTINELS: ports.sentinels.map(host).join(','),
                REDIS_SENTINEL_NAME: SENTINEL_NAME,
                // haproxy connects from loopback: its X-Forwarded-For is the one to believe (DECISIONS 27).
                TRUST_PROXY: '127.0.0.1',
                ...opts.gatewayEnv
              },
              `http://${host(ports.gateways[i]!)}/health`
            )
          )
      )
    )

    log('haproxy')
    const haproxyEnv: HaproxyEnv = {
      HAPROXY_HTTPS_BIND: host(ports.https),
      HAPROXY_TLS_CERT: certs.haproxyPem,
      HAPROXY_STATS_BIND: host(ports.haproxyAdmin),
      HAPROXY_STATS_SOCKET: join(runDir, 'haproxy.sock'),
      GATEWAY_1: host(ports.gateways[0]!),
      GATEWAY_2: host(ports.gateways[1]!),
      GATEWAY_3: host(ports.gateways[2]!)
    }
    await parts.start(haproxySpec(join(root, 'deploy', 'haproxy', 'haproxy.cfg'), haproxyEnv))

    log('prometheus')
    await parts.start(
      prometheusSpec(
        runDir,
        root,
        {
          gateways: ports.gatewayMetrics.map(host),
          haproxy: host(ports.haproxyAdmin),
          self: host(ports.prometheus)
        },
        opts.scrapeIntervalS ?? 5
      )
    )
  } catch (err) {
    await topology.stop()
    throw err
  }
  return topology
}

/** The stats socket's path in a run directory. */
export function statsSocket (runDir: string): string {
  return join(runDir, 'haproxy.sock')
}
