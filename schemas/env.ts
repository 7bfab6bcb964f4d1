/**
 * The gateway's environment (DECISIONS "Configuration"). One schema gives the
 * config type, the validation and the error messages.
 */
import { Type, type Static } from '@sinclair/typebox'

/** src/env.ts accepts only plain digits for these: '40.5' and '4e3' are errors, not 40 and 4. */
const Integer = (min: number, max: number, description: string, dflt: number) =>
  Type.Integer({ minimum: min, maximum: max, default: dflt, description })

export const Env = Type.Object({
  NODE_ENV: Type.Union([Type.Literal('development'), Type.Literal('production'), Type.Literal('test')], { default: 'development', description: "development, production or test; production refuses to start without a JWT key or UPSTREAM_URL" }),
  PORT: Integer(0, 65535, 'listen port', 3000),
  HOST: Type.String({ minLength: 1, default: '0.0.0.0', description: 'listen address' }),
  LOG_LEVEL: Type.Union(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'].map((l) => Type.Literal(l)), { default: 'info', description: 'pino level' }),
  JWT_SECRET: Type.Optional(Type.String({ minLength: 32, description: 'HS256 secret, e.g. the output of openssl rand -hex 32' })),
  JWT_PUBLIC_KEY: Type.Optional(Type.String({ minLength: 1, description: 'PEM public key for RS256 or ES256' })),
  JWT_ISSUER: Type.Optional(Type.String({ minLength: 1, description: 'required iss claim' })),
  JWT_AUDIENCE: Type.Optional(Type.String({ minLength: 1, description: 'required aud claim' })),
  JWT_JWKS_URL: Type.Optional(Type.String({ pattern: '^https?://[^\\s]+$', description: "the identity provider's JSON Web Key Set, an http(s) URL (DECISIONS 13)" })),
  JWT_CLOCK_TOLERANCE_S: Integer(0, 300, 'seconds of clock drift allowed when checking exp and nbf', 5),
  JWT_JWKS_COOLDOWN_S: Integer(1, 3600, 'seconds between key-set refetches caused by an unknown kid', 30),
  UPSTREAM_URL: Type.Optional(Type.String({ pattern: '^https?://[^\\s/?#,]+/?(\\s*,\\s*https?://[^\\s/?#,]+/?)*$', description: 'base URL of the engine, http(s)://host:port with no path; several, comma-separated, for several engine instances (DECISIONS 24)' })),
  UPSTREAM_TIMEOUT_MS: Integer(1, 600_000, 'how long to wait for the engine response headers, in ms', 10_000),
  METRICS_PORT: Integer(0, 65535, 'port of the Prometheus /metrics listener on HOST, 0 for none', 9464),
  RATE_LIMIT_PER_MINUTE: Integer(0, 1_000_000, 'requests per user (token sub) per 60 s on /api/*, 0 turns the limit off', 600),
  REDIS_URL: Type.Optional(Type.String({ pattern: '^rediss?://[^\\s]+$', description: 'redis://[user:password@]host:port[/db] for shared rate limits and idempotency records' })),
  IDEMPOTENCY_TTL_S: Integer(1, 30 * 86_400, 'how long an Idempotency-Key record is kept, in seconds', 86_400),
  SHED_EVENT_LOOP_DELAY_MS: Integer(0, 60_000, 'event loop delay past which new /api/* requests get 503, in ms; 0 turns it off', 200),
  UPSTREAM_MAX_QUEUE: Integer(1, 100_000, 'requests that may wait for an engine connection; past it new /api/* requests get 503', 256),
  UPSTREAM_TRY_TIMEOUT_MS: Type.Optional(Type.Integer({ minimum: 1, maximum: 600_000, description: 'how long one try of a GET to the engine may wait for headers before it is retried on another endpoint, in ms; default a third of UPSTREAM_TIMEOUT_MS' }))
})
export type Env = Static<typeof Env>
