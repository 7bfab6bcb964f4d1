/**
 * What each scenario sends, and to which server. Baselines (direct, nginx) hit
 * the same mock the gateway forwards to, so the ratios compare proxy hops and
 * nothing else.
 */
import { createForm, pngImage, updateBody } from './payloads.js'

/** mock: the upstream itself; gateway-logging: a second gateway with LOG_LEVEL=info. */
export type TargetName = 'mock' | 'nginx' | 'gateway' | 'gateway-logging'

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
  body?: (context: RequestContext) => { body: Buffer | string, contentType: string }
}

export interface RequestContext {
  /** A portfolio the token's user owns (created during setup), so updates are not 404 on a real engine. */
  portfolioId: string
}

export interface BuiltRequest {
  method: 'GET' | 'POST'
  path: string
  headers: Record<string, string>
  body?: Buffer | string
}

const PING = '/api/portfolio/ping'
const SMALL_IMAGE_BYTES = 4 * 1024
/** The largest image well inside the 10 MiB limit: 10 MiB - 1 KiB (DECISIONS 5). */
const LARGE_IMAGE_BYTES = 10 * 1024 * 1024 - 1024

// A few large uploads in flight already saturate loopback and the gateway's
// stream handling; 50 of them would only measure memory pressure.
const LARGE_UPLOAD_CONNECTIONS = 4

// Images are built once per process and shared by every round.
let smallForm: ReturnType<typeof createForm> | undefined
let largeForm: ReturnType<typeof createForm> | undefined

export const SCENARIOS: readonly Scenario[] = [
  { name: 'direct', description: 'mock ping, no auth (the limit)', target: 'mock', method: 'GET', path: PING, auth: false, localOnly: true },
  { name: 'nginx', description: 'nginx -> mock ping, no auth', target: 'nginx', method: 'GET', path: PING, auth: false, localOnly: true },
  { name: 'ping', description: 'gateway ping, JWT', target: 'gateway', method: 'GET', path: PING, auth: true, localOnly: false },
  {
    name: 'update',
    description: 'gateway update, 5 positions',
    target: 'gateway',
    method: 'POST',
    path: '/api/portfolio/update',
    auth: true,
    localOnly: false,
    body: (context) => ({ body: updateBody(context.portfolioId), contentType: 'application/json' })
  },
  {
    name: 'create',
    description: `gateway create, ${SMALL_IMAGE_BYTES / 1024} KiB PNG`,
    target: 'gateway',
    method: 'POST',
    path: '/api/portfolio/create',
    auth: true,
    localOnly: false,
    body: () => {
      smallForm ??= createForm(pngImage(SMALL_IMAGE_BYTES))
      return smallForm
    }
  },
  {
    name: 'create-10mib',
    description: 'gateway create, 10 MiB - 1 KiB PNG',
    target: 'gateway',
    method: 'POST',
    path: '/api/portfolio/create',
    auth: true,
    localOnly: false,
    explicitWithTarget: true,
    connections: (requested) => Math.min(requested, LARGE_UPLOAD_CONNECTIONS),
    body: () => {
      largeForm ??= createForm(pngImage(LARGE_IMAGE_BYTES))
      return largeForm
    }
  },
  { name: 'ping-logging', description: 'gateway ping, JWT, LOG_LEVEL=info', target: 'gateway-logging', method: 'GET', path: PING, auth: true, localOnly: true }
]

export function findScenario (name: string): Scenario | undefined {
  return SCENARIOS.find((s) => s.name === name)
}

export function buildRequest (scenario: Scenario, token: string, context: RequestContext): BuiltRequest {
  const headers: Record<string, string> = {}
  if (scenario.auth) headers.authorization = `Bearer ${token}`
  const built: BuiltRequest = { method: scenario.method, path: scenario.path, headers }
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
