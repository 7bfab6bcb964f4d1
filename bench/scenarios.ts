/**
 * What each scenario sends, and to which server. Baselines (direct, nginx) hit
 * the same mock the gateway forwards to, so the ratios compare proxy hops and
 * nothing else.
 */
import { randomBytes, randomUUID } from 'node:crypto'
import type { Feature } from './features.js'
import { createForm, pngImage, updateBody } from './payloads.js'

/**
 * mock: the upstream itself; nginx: nginx in front of it; bare: the bare
 * proxy (bare-proxy.ts), the baseline of every CPU ratio; every other target
 * is a gateway process configured as GATEWAYS says.
 */
export type TargetName = 'mock' | 'nginx' | 'bare' | 'bare-fastify' | GatewayName

/** A key of GATEWAYS: the fixed configurations below, or a scenario's own (Scenario.gateway). */
export type GatewayName = string

/** How one gateway process is configured. Everything not named is off (processes.ts BARE_GATEWAY_ENV). */
export interface GatewaySpec {
  logLevel: 'warn' | 'info'
  /** hs256: JWT_SECRET; keyset: JWT_JWKS_URL of the harness's key server. */
  auth: 'hs256' | 'keyset'
  /** in-process, Redis-backed or in a Redis Cluster, set so high it never refuses. */
  rateLimit: 'off' | 'memory' | 'redis' | 'redis-cluster'
  metrics: boolean
  /** SHED_EVENT_LOOP_DELAY_MS at its default (200 ms) instead of 0. */
  shedding: boolean
  /** What the gateway must have for this configuration to mean anything. */
  needs: Feature[]
  /** Engine endpoints (DECISIONS 24): 2 starts a second mock and lists both in UPSTREAM_URL. */
  engines?: 1 | 2
  /** OTLP traces to a sink that discards (bench/otlp-sink.ts), this share of requests sampled (traceidratio: the
   * client's sampled flag aside).
   */
  traceRatio?: number
  /** The everything-on profile: gets --prod-env, and always runs with what this build has. */
  everythingOn?: boolean
  /** More settings, applied after all of the above (e.g. a feature with no field here). */
  env?: Record<string, string>
  /** Another build's gateway (run.ts --compare); default this build's dist/src/server.js. */
  script?: string
  /** The node binary that runs it (run.ts --runtime); default the harness's own. */
  node?: string
}

const BARE: GatewaySpec = {
  logLevel: 'warn',
  auth: 'hs256',
  rateLimit: 'off',
  metrics: false,
  shedding: false,
  needs: []
}
/** What an operator runs. Idempotency is per request (the header), not a setting. */
export const PRODUCTION: GatewaySpec = {
  logLevel: 'info',
  auth: 'keyset',
  rateLimit: 'memory',
  metrics: true,
  shedding: true,
  needs: ['jwks', 'rate-limit', 'metrics', 'shedding', 'traceparent'],
  everythingOn: true
}

const FIXED_GATEWAYS: Record<string, GatewaySpec> = {
  gateway: BARE,
  'gateway-logging': { ...BARE, logLevel: 'info' },
  'gateway-jwks': { ...BARE, auth: 'keyset', needs: ['jwks'] },
  'gateway-ratelimit': { ...BARE, rateLimit: 'memory', needs: ['rate-limit'] },
  'gateway-redis': { ...BARE, rateLimit: 'redis', needs: ['rate-limit', 'redis'] },
  'gateway-redis-cluster': { ...BARE, rateLimit: 'redis-cluster', needs: ['rate-limit', 'redis-cluster'] },
  'gateway-metrics': { ...BARE, metrics: true, needs: ['metrics'] },
  'gateway-shedding': { ...BARE, shedding: true, needs: ['shedding'] },
  'gateway-prod': PRODUCTION,
  'gateway-prod-redis': { ...PRODUCTION, rateLimit: 'redis', needs: [...PRODUCTION.needs, 'redis'] },
  'gateway-2-engines': { ...BARE, engines: 2 },
  // DECISIONS 29: everything on, plus traces at the default 1% and at 100%.
  'gateway-prod-traced': { ...PRODUCTION, traceRatio: 0.01 },
  'gateway-prod-traced-all': { ...PRODUCTION, traceRatio: 1 }
}

/** A target's own name, without a --runtime copy's `@label`. */
const ownTarget = (target: TargetName): string => target.replace(/@[^@]*$/, '')
export const isGateway = (target: TargetName): target is GatewayName =>
  !['mock', 'nginx', 'bare', 'bare-fastify'].includes(ownTarget(target))

/** Headers that must differ on every request: a reused Idempotency-Key would be a replay, not an update. */
export type FreshHeader = 'idempotency-key' | 'traceparent'

/**
 * A row of the cost table (docs/performance.md): this scenario's server CPU
 * per request as a ratio to `base`'s (a bare-proxy scenario), per round, the
 * median over rounds; `adds`, when given, is the scenario it adds one feature
 * to, and the row also shows the feature's own share of the bare proxy's cost
 * (this minus `adds`, over `base`).
 */
export interface CostRow {
  /** What the row measures, as the table shows it. */
  feature: string
  base: 'bare-ping' | 'bare-update'
  adds?: string
  /** The row's ceiling as a ratio to `base` (e.g. 1.10), or for a feature the most its share may be (0.05). */
  goal?: { ratio?: number; share?: number }
}

export interface Scenario {
  name: string
  description: string
  target: TargetName
  method: 'GET' | 'POST'
  path: string
  /** Sends `authorization: Bearer <token>`. */
  auth: boolean
  /** Needs the local mock and processes; not available against --target. */
  localOnly: boolean
  /** Only run when named in --only with --target (uploads 10 MiB per request to a real deployment). */
  explicitWithTarget?: boolean
  /** Connections to use given the requested number. */
  connections?: (requested: number) => number
  /** Built on demand: the 10 MiB body should only exist when that scenario runs. */
  body?: (context: RequestContext) => { body: Buffer | string; contentType: string }
  /** Headers made new for every request. */
  fresh?: FreshHeader[]
  /** Tokens of this many users, sent in turn (each connection cycles through them), instead of one user's. */
  users?: number
  /** Features the scenario needs beyond its gateway's (GATEWAYS[target].needs). */
  needs?: Feature[]
  /** Its row in the cost table, if it has one. */
  cost?: CostRow
}

/**
 * A SCENARIOS entry: either a `target` of its own or, for a configuration no
 * other scenario shares, the `gateway` itself (which then runs under the
 * scenario's name). Adding a scenario is one entry in ENTRIES.
 */
export type ScenarioEntry =
  | (Omit<Scenario, 'target'> & { target: TargetName; gateway?: undefined }) |
  (Omit<Scenario, 'target'> & { target?: undefined; gateway: GatewaySpec })

export interface RequestContext {
  /** A portfolio the token's user owns (created during setup), so updates are not 404 on a real engine. */
  portfolioId: string
}

export interface BuiltRequest {
  method: 'GET' | 'POST'
  path: string
  headers: Record<string, string>
  body?: Buffer | string
  fresh?: FreshHeader[]
  /** Header sets sent in turn, one per request (Scenario.users); autocannon builds each once. */
  rotate?: Array<Record<string, string>>
}

/** W3C Trace Context: version 00, a random trace id and parent id, sampled. */
export function newTraceparent (): string {
  return `00-${randomBytes(16).toString('hex')}-${randomBytes(8).toString('hex')}-01`
}

/** The values of the fresh headers for one request. */
export function freshHeaders (names: readonly FreshHeader[]): Record<string, string> {
  const headers: Record<string, string> = {}
  for (const name of names) headers[name] = name === 'traceparent' ? newTraceparent() : randomUUID()
  return headers
}

const PING = '/api/portfolio/ping'
const UPDATE = '/api/portfolio/update'
const CREATE = '/api/portfolio/create'
const SMALL_IMAGE_BYTES = 4 * 1024
/** The largest image well inside the 10 MiB limit: 10 MiB - 1 KiB (DECISIONS 5). */
const LARGE_IMAGE_BYTES = 10 * 1024 * 1024 - 1024

// A few large uploads in flight already saturate loopback and the gateway's
// stream handling; 50 of them would only measure memory pressure.
const LARGE_UPLOAD_CONNECTIONS = 4

// Images are built once per process and shared by every round.
let smallForm: ReturnType<typeof createForm> | undefined
let largeForm: ReturnType<typeof createForm> | undefined

const updateRequest = (context: RequestContext): { body: string; contentType: string } => ({
  body: updateBody(context.portfolioId),
  contentType: 'application/json'
})
const smallCreate = (): { body: Buffer; contentType: string } => {
  smallForm ??= createForm(pngImage(SMALL_IMAGE_BYTES))
  return smallForm
}

/** A feature's row: its cost against the bare proxy, and its own share over the bare gateway (at most 5%). */
const feature = (name: string, over: 'ping' | 'update' = 'ping'): CostRow => ({
  feature: name,
  base: over === 'ping' ? 'bare-ping' : 'bare-update',
  adds: over,
  goal: { share: 0.05 }
})

const ENTRIES: readonly ScenarioEntry[] = [
  {
    name: 'direct',
    description: 'mock ping, no auth (the limit)',
    target: 'mock',
    method: 'GET',
    path: PING,
    auth: false,
    localOnly: true
  },
  {
    name: 'nginx',
    description: 'nginx -> mock ping, no auth',
    target: 'nginx',
    method: 'GET',
    path: PING,
    auth: false,
    localOnly: true
  },
  // DECISIONS 30: the floor every CPU ratio is stated against.
  {
    name: 'bare-ping',
    description: 'bare Node proxy ping, HS256 (cached)',
    target: 'bare',
    method: 'GET',
    path: PING,
    auth: true,
    localOnly: true,
    cost: { feature: 'bare Node proxy (node:http, cached HS256, undici Pool dispatch)', base: 'bare-ping' }
  },
  {
    name: 'fastify-ping',
    description: 'the bare proxy on Fastify: ping, HS256 (cached)',
    target: 'bare-fastify',
    method: 'GET',
    path: PING,
    auth: true,
    localOnly: true,
    cost: { feature: 'the bare proxy on Fastify (what the framework alone costs)', base: 'bare-ping' }
  },
  {
    name: 'bare-update',
    description: 'bare Node proxy update, HS256 (cached), body streamed on',
    target: 'bare',
    method: 'POST',
    path: UPDATE,
    auth: true,
    localOnly: true,
    body: updateRequest
  },
  {
    name: 'ping',
    description: 'gateway ping, JWT',
    target: 'gateway',
    method: 'GET',
    path: PING,
    auth: true,
    localOnly: false,
    cost: {
      feature: 'gateway, nothing on (LOG_LEVEL=warn, no metrics, no limits)',
      base: 'bare-ping',
      goal: { ratio: 1.1 }
    }
  },
  {
    name: 'update',
    description: 'gateway update, 5 positions',
    target: 'gateway',
    method: 'POST',
    path: UPDATE,
    auth: true,
    localOnly: false,
    body: updateRequest,
    cost: { feature: 'gateway update, nothing on (validated, canonical body)', base: 'bare-update' }
  },
  {
    name: 'create',
    description: `gateway create, ${SMALL_IMAGE_BYTES / 1024} KiB PNG`,
    target: 'gateway',
    method: 'POST',
    path: CREATE,
    auth: true,
    localOnly: false,
    body: smallCreate
  },
  {
    name: 'create-10mib',
    description: 'gateway create, 10 MiB - 1 KiB PNG',
    target: 'gateway',
    method: 'POST',
    path: CREATE,
    auth: true,
    localOnly: false,
    explicitWithTarget: true,
    connections: (requested) => Math.min(requested, LARGE_UPLOAD_CONNECTIONS),
    body: () => {
      largeForm ??= createForm(pngImage(LARGE_IMAGE_BYTES))
      return largeForm
    }
  },
  // One feature at a time, each against the bare `ping` / `update` above, in the cost table's order.
  {
    name: 'ping-logging',
    description: 'gateway ping, JWT, LOG_LEVEL=info',
    target: 'gateway-logging',
    method: 'GET',
    path: PING,
    auth: true,
    localOnly: true,
    cost: feature('access log at info')
  },
  {
    name: 'ping-metrics',
    description: 'gateway ping, metrics on',
    target: 'gateway-metrics',
    method: 'GET',
    path: PING,
    auth: true,
    localOnly: true,
    cost: feature('metrics')
  },
  {
    name: 'ping-ratelimit',
    description: 'gateway ping, rate limit in-process (never reached)',
    target: 'gateway-ratelimit',
    method: 'GET',
    path: PING,
    auth: true,
    localOnly: true,
    cost: feature('rate limit, in-process')
  },
  {
    name: 'ping-redis',
    description: 'gateway ping, rate limit in Redis (never reached)',
    target: 'gateway-redis',
    method: 'GET',
    path: PING,
    auth: true,
    localOnly: true,
    cost: feature('rate limit, Redis')
  },
  // GATEWAY_WORKERS=2 (DECISIONS 35, "Workers"): the same gateway as two processes on one port; its CPU is both's.
  {
    name: 'ping-redis-2-workers',
    description: 'gateway ping, rate limit in Redis, two workers on one port (GATEWAY_WORKERS=2)',
    gateway: { ...BARE, rateLimit: 'redis', needs: ['rate-limit', 'redis'], env: { GATEWAY_WORKERS: '2' } },
    method: 'GET',
    path: PING,
    auth: true,
    localOnly: true,
    cost: { feature: 'two workers on one port', base: 'bare-ping', adds: 'ping-redis' }
  },
  // The same on a three-primary Redis Cluster (REDIS_CLUSTER_NODES): one user's keys in one slot.
  {
    name: 'ping-redis-cluster',
    description: 'gateway ping, rate limit in a 3-primary Redis Cluster (never reached)',
    target: 'gateway-redis-cluster',
    method: 'GET',
    path: PING,
    auth: true,
    localOnly: true
  },
  // One user's hits of a loop turn sum into one INCRBY; here every request of a batch may be another user's.
  {
    name: 'ping-redis-users',
    description: 'gateway ping, rate limit in Redis, 50 users in turn',
    target: 'gateway-redis',
    method: 'GET',
    path: PING,
    auth: true,
    localOnly: true,
    users: 50
  },
  {
    name: 'ping-traceparent',
    description: 'gateway ping, a new traceparent per request',
    target: 'gateway',
    method: 'GET',
    path: PING,
    auth: true,
    localOnly: false,
    fresh: ['traceparent'],
    needs: ['traceparent'],
    cost: feature('trace context (a client traceparent)')
  },
  {
    name: 'ping-shedding',
    description: 'gateway ping, load shedding on (SHED_EVENT_LOOP_DELAY_MS=200, or --shed-delay-ms)',
    target: 'gateway-shedding',
    method: 'GET',
    path: PING,
    auth: true,
    localOnly: true,
    cost: feature('load shedding')
  },
  // The cluster client's cost per request with two endpoints (balancer, health, retry state) against `ping`'s one.
  {
    name: 'ping-2-engines',
    description: 'gateway ping, JWT, two mock engines (least-request of two)',
    target: 'gateway-2-engines',
    method: 'GET',
    path: PING,
    auth: true,
    localOnly: true,
    cost: feature('two engine endpoints')
  },
  {
    name: 'ping-jwks',
    description: 'gateway ping, key-set token (RS256, JWKS cached)',
    target: 'gateway-jwks',
    method: 'GET',
    path: PING,
    auth: true,
    localOnly: true,
    cost: feature('key-set token (RS256 from a JWKS)')
  },
  {
    name: 'update-idempotent',
    description: 'gateway update, a new Idempotency-Key per request',
    target: 'gateway',
    method: 'POST',
    path: UPDATE,
    auth: true,
    localOnly: false,
    fresh: ['idempotency-key'],
    needs: ['idempotency'],
    body: updateRequest,
    cost: feature('Idempotency-Key on update (in-process store)', 'update')
  },
  // Traces (DECISIONS 29): prod-ping plus an OTLP export to a sink process, at 1% and at 100% of requests.
  {
    name: 'prod-ping-traced',
    description: 'everything on: ping, traces at 1% to an OTLP sink',
    target: 'gateway-prod-traced',
    method: 'GET',
    path: PING,
    auth: true,
    localOnly: true
  },
  {
    name: 'prod-ping-traced-all',
    description: 'everything on: ping, every request traced to an OTLP sink',
    target: 'gateway-prod-traced-all',
    method: 'GET',
    path: PING,
    auth: true,
    localOnly: true
  },
  // Everything on (key-set token, rate limit, metrics, shedding, info logging, traceparent).
  ...(['gateway-prod', 'gateway-prod-redis'] as const).flatMap((target): ScenarioEntry[] => {
    const prefix = target === 'gateway-prod' ? 'prod' : 'prod-redis'
    const store = target === 'gateway-prod' ? 'in-process' : 'Redis'
    const common = { target, auth: true, localOnly: true, fresh: ['traceparent'] as FreshHeader[] }
    return [
      {
        ...common,
        name: `${prefix}-ping`,
        description: `everything on (${store} limit): ping`,
        method: 'GET',
        path: PING,
        ...(target === 'gateway-prod'
          ? {
              cost: {
                feature: 'everything on: info log, metrics, in-process limit, shedding, trace context, key-set token',
                base: 'bare-ping',
                goal: { ratio: 1.3 }
              } as CostRow
            }
          : {})
      },
      {
        ...common,
        name: `${prefix}-update`,
        description: `everything on (${store} limit): update`,
        method: 'POST',
        path: UPDATE,
        body: updateRequest
      },
      {
        ...common,
        name: `${prefix}-create`,
        description: `everything on (${store} limit): create ${SMALL_IMAGE_BYTES / 1024} KiB`,
        method: 'POST',
        path: CREATE,
        body: smallCreate
      }
    ]
  })
]

/** Every gateway configuration: the fixed ones, and each scenario's own under the scenario's name. */
export const GATEWAYS: Record<GatewayName, GatewaySpec> = {
  ...FIXED_GATEWAYS,
  ...Object.fromEntries(ENTRIES.flatMap((e) => (e.gateway === undefined ? [] : [[e.name, e.gateway]])))
}

export const SCENARIOS: readonly Scenario[] = ENTRIES.map(({ gateway, ...entry }) => ({
  ...entry,
  target: entry.target ?? entry.name
}))

export function findScenario (name: string): Scenario | undefined {
  return SCENARIOS.find((s) => s.name === name)
}

export function buildRequest (scenario: Scenario, token: string, context: RequestContext): BuiltRequest {
  const headers: Record<string, string> = {}
  if (scenario.auth) headers.authorization = `Bearer ${token}`
  const built: BuiltRequest = {
    method: scenario.method,
    path: scenario.path,
    headers,
    ...(scenario.fresh === undefined ? {} : { fresh: scenario.fresh })
  }
  if (scenario.body !== undefined) {
    const { body, contentType } = scenario.body(context)
    headers['content-type'] = contentType
    built.body = body
  }
  return built
}

/** The small create form, for making the portfolio that updates name. */
export function setupCreateRequest (token: string): BuiltRequest {
  const create = findScenario('create')
  if (create === undefined) throw new Error('create scenario missing')
  return buildRequest(create, token, { portfolioId: '' })
}
