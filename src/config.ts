/**
 * Environment -> validated, frozen configuration. Nothing here reads
 * `process.env` itself: the caller passes the environment in, so tests can too.
 */
import { createPublicKey, randomBytes } from 'node:crypto'
import { Env } from '../schemas/env.js'
import { readEnv } from './shared/env.js'

export type JwtAlgorithm = 'HS256' | 'RS256' | 'ES256'

export interface JwtConfig {
  /** HS256 secret or PEM public key. */
  readonly key: string
  /** The only algorithm accepted: pinned, never taken from the token. */
  readonly algorithm: JwtAlgorithm
  readonly issuer?: string
  readonly audience?: string
  /** True when no key was configured and a development secret was generated. */
  readonly generated: boolean
}

export interface GatewayConfig {
  readonly production: boolean
  readonly port: number
  readonly host: string
  readonly logLevel: string
  readonly jwt: JwtConfig
  /** Unset: the gateway starts the embedded reference engine. */
  readonly upstreamUrl?: string
  readonly upstreamTimeoutMs: number
  readonly limits: LimitsConfig
}

/** Rate limits, load shedding and idempotency (DECISIONS 14-17). */
export interface LimitsConfig {
  /** 0: no rate limit. */
  readonly ratePerMinute: number
  /** Unset: counters and records live in the process. */
  readonly redisUrl?: string
  readonly idempotencyTtlS: number
  /** 0: the event loop is not watched. */
  readonly shedEventLoopDelayMs: number
  readonly upstreamMaxQueue: number
}

/** A configuration error: its message is one line that names the variable and the fix. */
export class ConfigError extends Error {
  override name = 'ConfigError'
}

/** Parse and check the environment. Throws ConfigError on the first bad value; `env` is never changed. */
export function loadConfig (env: Record<string, string | undefined>): GatewayConfig {
  const read = readEnv(Env, env)
  if (!read.ok) {
    // Keys and secrets never reach a log or a terminal, even when they are wrong.
    const shown = read.name.startsWith('JWT_') || read.name === 'REDIS_URL' ? '(hidden)' : JSON.stringify(read.given)
    throw new ConfigError(`${read.name}=${shown} is invalid: ${read.problem}; expected ${read.expected}`)
  }
  const parsed = read.value
  const production = parsed.NODE_ENV === 'production'
  return Object.freeze({
    production,
    port: parsed.PORT,
    host: parsed.HOST,
    logLevel: parsed.LOG_LEVEL,
    jwt: Object.freeze(jwtConfig(parsed, production)),
    ...(parsed.UPSTREAM_URL === undefined ? {} : { upstreamUrl: parsed.UPSTREAM_URL.replace(/\/$/, '') }),
    upstreamTimeoutMs: parsed.UPSTREAM_TIMEOUT_MS,
    limits: Object.freeze({
      ratePerMinute: parsed.RATE_LIMIT_PER_MINUTE,
      ...(parsed.REDIS_URL === undefined ? {} : { redisUrl: parsed.REDIS_URL }),
      idempotencyTtlS: parsed.IDEMPOTENCY_TTL_S,
      shedEventLoopDelayMs: parsed.SHED_EVENT_LOOP_DELAY_MS,
      upstreamMaxQueue: parsed.UPSTREAM_MAX_QUEUE
    })
  })
}

function jwtConfig (env: Env, production: boolean): JwtConfig {
  const claims = {
    ...(env.JWT_ISSUER === undefined ? {} : { issuer: env.JWT_ISSUER }),
    ...(env.JWT_AUDIENCE === undefined ? {} : { audience: env.JWT_AUDIENCE })
  }
  if (env.JWT_SECRET !== undefined && env.JWT_PUBLIC_KEY !== undefined) {
    throw new ConfigError('JWT_SECRET and JWT_PUBLIC_KEY are both set: set exactly one (HS256 secret or RS256/ES256 public key)')
  }
  if (env.JWT_PUBLIC_KEY !== undefined) {
    // Container environments often carry a PEM on one line with literal "\n".
    const pem = env.JWT_PUBLIC_KEY.replace(/\\n/g, '\n')
    return { key: pem, algorithm: publicKeyAlgorithm(pem), generated: false, ...claims }
  }
  if (env.JWT_SECRET !== undefined) {
    return { key: env.JWT_SECRET, algorithm: 'HS256', generated: false, ...claims }
  }
  if (production) {
    throw new ConfigError('NODE_ENV=production needs a JWT key: set JWT_SECRET (HS256, 32+ characters) or JWT_PUBLIC_KEY (PEM, RS256/ES256)')
  }
  return { key: randomBytes(32).toString('base64url'), algorithm: 'HS256', generated: true, ...claims }
}

/** The algorithm is pinned by the key's type: an RSA key only verifies RS256, a P-256 key only ES256. */
function publicKeyAlgorithm (pem: string): JwtAlgorithm {
  let key
  try {
    key = createPublicKey(pem)
  } catch {
    throw new ConfigError('JWT_PUBLIC_KEY is not a PEM public key: pass the text of the key, starting with -----BEGIN PUBLIC KEY-----')
  }
  if (key.asymmetricKeyType === 'rsa') return 'RS256'
  if (key.asymmetricKeyType === 'ec' && key.asymmetricKeyDetails?.namedCurve === 'prime256v1') return 'ES256'
  const what = key.asymmetricKeyType === 'ec'
    ? `an EC key on curve ${key.asymmetricKeyDetails?.namedCurve ?? 'unknown'}`
    : `a key of type ${key.asymmetricKeyType ?? 'unknown'}`
  throw new ConfigError(`JWT_PUBLIC_KEY is ${what}: use an RSA key (RS256) or a P-256 EC key (ES256)`)
}
