/**
 * build(t): a gateway for one test, closed in t.teardown. Tokens are minted
 * here with node:crypto, independently of the code under test.
 */
import { createHmac, createSign, generateKeyPairSync } from 'node:crypto'
import type { AppDeps } from '../../src/app.js'
import { compose, type ComposeOverrides, type Gateway, type LogOptions } from '../../src/compose.js'
import { loadConfig } from '../../src/config.js'
import type { EnginePoolOptions } from '../../src/engine-client/client.js'
import type { Lifecycle } from '../../src/routes/health.js'
import { checkInjects, watchAnswers } from './answer-check.js'

export const SECRET = 'test-secret-test-secret-test-secret-0123'

interface Teardown { teardown: (fn: () => unknown) => void }

export interface BuildOptions {
  upstreamUrl?: string
  env?: Record<string, string>
  lifecycle?: Lifecycle
  uploadStallTimeoutMs?: number
  /** The uploads' minimum-rate rule, shortened for a test (DECISIONS 23). */
  uploadMinRate?: AppDeps['uploadMinRate']
  /** The engine pool's sockets and idle keep-alive (defaults: 128, 500 ms). */
  engineConnections?: number
  engineKeepAliveMs?: number
  /** pino's options and the stream its lines go to; absent: nothing is logged. */
  logger?: LogOptions
  keySet?: ComposeOverrides['keySet']
  /** Lingering-close bounds (DECISIONS 21), shortened by tests. */
  linger?: AppDeps['linger']
  /** Pool settings for the test (e.g. a small pool and queue). */
  pool?: Partial<Pick<EnginePoolOptions, 'connections' | 'maxQueue'>>
  /** Several engines (DECISIONS 24): UPSTREAM_URL's comma-separated list; overrides upstreamUrl. */
  upstreamUrls?: readonly string[]
  /** Cluster settings for the test: shorter health checks, an injected DNS lookup, fixed randomness. */
  cluster?: Partial<Pick<EnginePoolOptions, 'health' | 'lookup' | 'resolveIntervalMs' | 'random' | 'tryTimeoutMs'>>
  /** OTLP traces (DECISIONS 29): a provider the test started (src/shared/tracing-sdk.ts). */
  tracing?: ComposeOverrides['tracing']
}

/** The gateway's parts (src/compose.ts) and the URL it listens on. */
export interface Built extends Gateway {
  url: string
}

/** Build with compose() and listen on loopback (real sockets), closing everything when the test ends. */
export async function build (t: Teardown, opts: BuildOptions = {}): Promise<Built> {
  // Event-loop shedding is off unless a test turns it on: this process runs the
  // clients and tap as well, and a stall of theirs would shed the gateway's requests.
  const config = loadConfig({
    JWT_SECRET: SECRET,
    UPSTREAM_URL: opts.upstreamUrls?.join(',') ?? opts.upstreamUrl ?? 'http://127.0.0.1:9',
    UPSTREAM_TIMEOUT_MS: '1000',
    SHED_EVENT_LOOP_DELAY_MS: '0',
    ...opts.env
  })
  // A single engine is health-checked too (DECISIONS 24), every 5 s: tests that count every request a
  // stub engine gets would count those checks, so a test of one engine gets checks only when it asks.
  const quiet = config.upstreamUrls!.length === 1 && opts.cluster?.health === undefined
    ? { health: { intervalMs: 0 } }
    : {}
  const engine: Partial<EnginePoolOptions> = {
    keepAliveTimeoutMs: opts.engineKeepAliveMs ?? 500,
    ...(opts.engineConnections === undefined ? {} : { connections: opts.engineConnections }),
    ...quiet,
    ...opts.pool,
    ...opts.cluster
  }
  const app = {
    ...(opts.uploadStallTimeoutMs === undefined ? {} : { uploadStallTimeoutMs: opts.uploadStallTimeoutMs }),
    ...(opts.uploadMinRate === undefined ? {} : { uploadMinRate: opts.uploadMinRate }),
    ...(opts.linger === undefined ? {} : { linger: opts.linger })
  }
  const gateway = await compose(config, {
    engine,
    app,
    ...(opts.lifecycle === undefined ? {} : { lifecycle: opts.lifecycle }),
    ...(opts.logger === undefined ? {} : { log: opts.logger }),
    ...(opts.keySet === undefined ? {} : { keySet: opts.keySet }),
    ...(opts.tracing === undefined ? {} : { tracing: opts.tracing })
  })
  // Every answer this gateway sends is held to openapi.json; registered first, so it runs after the close.
  const violations = watchAnswers(gateway.app.server)
  // app.inject() answers never reach the server's 'request' event: checked on their way back instead.
  checkInjects(gateway.app, violations)
  t.teardown(() => {
    if (violations.length > 0) throw new Error(`answers the document does not declare:\n${violations.join('\n')}`)
  })
  t.teardown(gateway.close)
  // Names in UPSTREAM_URL resolved before the first request, so a test's first call finds its endpoints.
  await gateway.engine.ready()
  const url = await gateway.app.listen({ port: 0, host: '127.0.0.1' })
  return { ...gateway, url }
}

const b64url = (value: unknown): string => Buffer.from(typeof value === 'string' ? value : JSON.stringify(value)).toString('base64url')
const now = (): number => Math.floor(Date.now() / 1000)

export interface Claims { sub?: unknown, exp?: number, nbf?: number, iss?: string, aud?: string, [k: string]: unknown }

/** HS256 token; `exp` one hour ahead unless given (pass exp: undefined via `omitExp`). */
export function hs256 (claims: Claims = {}, secret = SECRET, header: Record<string, unknown> = { alg: 'HS256', typ: 'JWT' }): string {
  const payload = { sub: 'alice', iat: now(), exp: now() + 3600, ...claims }
  const fields = payload as Record<string, unknown>
  for (const k of Object.keys(fields)) if (fields[k] === undefined) delete fields[k]
  const input = `${b64url(header)}.${b64url(payload)}`
  return `${input}.${createHmac('sha256', secret).update(input).digest('base64url')}`
}

export function unsigned (claims: Claims = {}): string {
  return `${b64url({ alg: 'none', typ: 'JWT' })}.${b64url({ sub: 'alice', exp: now() + 3600, ...claims })}.`
}

export function keyPair (type: 'rsa' | 'ec'): { publicKey: string, privateKey: string } {
  return type === 'rsa'
    ? generateKeyPairSync('rsa', { modulusLength: 2048, publicKeyEncoding: { type: 'spki', format: 'pem' }, privateKeyEncoding: { type: 'pkcs8', format: 'pem' } })
    : generateKeyPairSync('ec', { namedCurve: 'prime256v1', publicKeyEncoding: { type: 'spki', format: 'pem' }, privateKeyEncoding: { type: 'pkcs8', format: 'pem' } })
}

export function signAsymmetric (alg: 'RS256' | 'ES256', privateKey: string, claims: Claims = {}): string {
  const input = `${b64url({ alg, typ: 'JWT' })}.${b64url({ sub: 'alice', iat: now(), exp: now() + 3600, ...claims })}`
  const signer = createSign('SHA256').update(input)
  const signature = alg === 'RS256' ? signer.sign(privateKey) : signer.sign({ key: privateKey, dsaEncoding: 'ieee-p1363' })
  return `${input}.${signature.toString('base64url')}`
}

export const bearer = (token = hs256()): Record<string, string> => ({ authorization: `Bearer ${token}` })

/** Valid mints (base58, 32 bytes). */
export const MINTS = [
  'So11111111111111111111111111111111111111112',
  'EPjFWvd5wDTHb2TN2oT7g1r4X6FAkLSs8hpsDu6VGnZC',
  'Es9vMFrzaCERmJfrF4H2FYD4KCoNkY5kGxHe5J9Fq7wW',
  'DezXAZ8z7PnrnRJjz3wXBoRgixCa6xjnB7YaB1pPB263'
] as const

export function validUpdate (): {
  portfolio_id: string
  target_positions: Array<{ mint: string, allocation: number }>
} {
  return { portfolio_id: 'p-1', target_positions: [{ mint: MINTS[0], allocation: 0.6 }, { mint: MINTS[1], allocation: 0.4 }] }
}
