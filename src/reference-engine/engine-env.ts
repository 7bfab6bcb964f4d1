/** The standalone engine's environment, validated; the caller passes it in, so tests can too. */
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Type, type Static } from '@sinclair/typebox'
import { readEnv } from '../shared/env.js'
import { DEFAULT_KEY_TTL_S } from './store.js'

/**
 * Gateways check each engine's /health this often, so a shorter production notice could close the listener before a
 * gateway has seen the 500 and stopped sending (decision: the engine drains too).
 */
export const GATEWAY_HEALTH_INTERVAL_MS = 5_000
export const PRODUCTION_DRAIN_NOTICE_MS = GATEWAY_HEALTH_INTERVAL_MS
/** Upper bound of the notice: a deployment's grace period has to fit it plus the requests in flight. */
const MAX_DRAIN_NOTICE_MS = 120_000
/**
 * After the notice, open connections get DRAIN_IDLE_GRACE_MS to send their last request and requests in flight get
 * IN_FLIGHT_GRACE_MS; test/deploy/timelines.test.ts checks the Kubernetes grace period against them.
 */
export const DRAIN_IDLE_GRACE_MS = 1_000
export const IN_FLIGHT_GRACE_MS = 25_000
const MAX_IDEMPOTENCY_TTL_S = 2_592_000

export const EngineEnv = Type.Object({
  NODE_ENV: Type.Union([Type.Literal('development'), Type.Literal('production'), Type.Literal('test')], {
    default: 'development',
    description: 'development, production or test; production gives a 5 s drain notice'
  }),
  ENGINE_PORT: Type.Integer({ minimum: 0, maximum: 65535, default: 4000, description: 'an integer port, 0-65535' }),
  ENGINE_METRICS_PORT: Type.Integer({
    minimum: 0,
    maximum: 65535,
    default: 0,
    description: 'an integer port, 0-65535, for GET /metrics on ENGINE_HOST; 0 (the default) serves none'
  }),
  ENGINE_HOST: Type.String({ minLength: 1, default: '127.0.0.1', description: 'a listen address such as 127.0.0.1' }),
  ENGINE_IMAGE_DIR: Type.String({ minLength: 1, description: 'a directory for uploaded images' }),
  ENGINE_DRAIN_NOTICE_MS: Type.Optional(Type.Integer({
    minimum: 0,
    maximum: MAX_DRAIN_NOTICE_MS,
    description: `milliseconds, 0-${MAX_DRAIN_NOTICE_MS}, of /health 500 before the listener closes on SIGTERM`
  })),
  ENGINE_IDEMPOTENCY_TTL_S: Type.Integer({
    minimum: 1,
    maximum: MAX_IDEMPOTENCY_TTL_S,
    default: DEFAULT_KEY_TTL_S,
    description: `seconds, 1-${MAX_IDEMPOTENCY_TTL_S}, that the record of a create's Idempotency-Key lives; ` +
      "keep it longer than the gateways' IDEMPOTENCY_TTL_S"
  }),
  ENGINE_REDIS_URL: Type.Optional(Type.String({
    pattern: '^rediss?://[^\\s]+$',
    description: 'redis://[user:password@]host:port[/db] (or rediss://) for the portfolios that several engines share'
  }))
})
export type EngineEnv = Static<typeof EngineEnv>

export interface EngineSettings {
  readonly port: number
  /** Set: GET /metrics at this port of `host`; unset: none. */
  readonly metricsPort?: number
  readonly host: string
  readonly imageDir: string
  /** How long /health answers 500 and every answer says `connection: close` before the listener closes. */
  readonly drainNoticeMs: number
  /** How long the record of an owner's Idempotency-Key lives. */
  readonly idempotencyTtlS: number
  readonly redisUrl?: string
}

/** Its message is one line naming the variable and what it should be. */
export class EngineEnvError extends Error {
  override name = 'EngineEnvError'
}

export function defaultImageDir (): string {
  return join(tmpdir(), 'portfolio-engine-images')
}

export function loadEngineEnv (env: Record<string, string | undefined>): EngineSettings {
  const read = readEnv(EngineEnv, { ...env, ENGINE_IMAGE_DIR: env['ENGINE_IMAGE_DIR'] || defaultImageDir() })
  if (!read.ok) {
    // A Redis URL may carry a password.
    const shown = read.name === 'ENGINE_REDIS_URL' ? '(hidden)' : JSON.stringify(read.given)
    throw new EngineEnvError(`${read.name}=${shown} is invalid: expected ${read.expected}`)
  }
  const parsed = read.value
  const production = parsed.NODE_ENV === 'production'
  const drainNoticeMs = parsed.ENGINE_DRAIN_NOTICE_MS ?? (production ? PRODUCTION_DRAIN_NOTICE_MS : 0)
  if (production && drainNoticeMs < GATEWAY_HEALTH_INTERVAL_MS) {
    throw new EngineEnvError(`ENGINE_DRAIN_NOTICE_MS=${drainNoticeMs} is too short for NODE_ENV=production: set at ` +
      `least ${GATEWAY_HEALTH_INTERVAL_MS} (the gateway's health-check interval), or leave it unset`)
  }
  if (parsed.ENGINE_METRICS_PORT !== 0 && parsed.ENGINE_METRICS_PORT === parsed.ENGINE_PORT) {
    throw new EngineEnvError(`ENGINE_METRICS_PORT=${parsed.ENGINE_METRICS_PORT} is ` +
      'ENGINE_PORT too: give metrics a port of their own, or 0 for none')
  }
  return Object.freeze({
    ...(parsed.ENGINE_METRICS_PORT === 0 ? {} : { metricsPort: parsed.ENGINE_METRICS_PORT }),
    port: parsed.ENGINE_PORT,
    host: parsed.ENGINE_HOST,
    imageDir: parsed.ENGINE_IMAGE_DIR,
    drainNoticeMs,
    idempotencyTtlS: parsed.ENGINE_IDEMPOTENCY_TTL_S,
    ...(parsed.ENGINE_REDIS_URL === undefined ? {} : { redisUrl: parsed.ENGINE_REDIS_URL })
  })
}
