/** Environment -> validated, frozen configuration; the caller passes the environment in, so tests can too. */
import { createPrivateKey, createPublicKey, randomBytes } from 'node:crypto'
import { isIP } from 'node:net'
import { Env } from '../schemas/env.js'
import { readEnv } from './shared/env.js'
import { REDIS_SECRET_VARIABLES, redisConfigOf, type RedisConfig } from './redis-config.js'
import { tracingSettingsOf, type TracingSettings } from './shared/tracing-settings.js'

export type { HostPort, RedisConfig } from './redis-config.js'

export type JwtAlgorithm = 'HS256' | 'RS256' | 'ES256'

interface JwtClaimsConfig {
  readonly issuer?: string
  readonly audience?: string
  /** Seconds of drift allowed on `exp` and `nbf` (provider and gateway clocks differ). */
  readonly clockToleranceS: number
}

/** One key: an HS256 secret or a PEM public key. */
export interface JwtStaticKeyConfig extends JwtClaimsConfig {
  readonly source: 'static'
  readonly key: string
  /** The only algorithm accepted: pinned, never taken from the token. */
  readonly algorithm: JwtAlgorithm
  /** True when no key was configured and a development secret was generated. */
  readonly generated: boolean
}

/** The identity provider's JSON Web Key Set: each key pins its own algorithm. */
export interface JwtKeySetConfig extends JwtClaimsConfig {
  readonly source: 'jwks'
  readonly jwksUrl: string
  /** Seconds between refetches caused by an unknown `kid`. */
  readonly jwksCooldownS: number
  readonly issuer: string
  readonly generated: false
}

export type JwtConfig = JwtStaticKeyConfig | JwtKeySetConfig

export interface GatewayConfig {
  readonly production: boolean
  readonly port: number
  readonly host: string
  readonly logLevel: string
  readonly jwt: JwtConfig
  /** Unset: the gateway starts the embedded reference engine. */
  readonly upstreamUrl?: string
  /** Every base URL of UPSTREAM_URL, in order; upstreamUrl is the first. */
  readonly upstreamUrls?: readonly string[]
  /** One try of a GET when another endpoint can take a retry (UPSTREAM_TRY_TIMEOUT_MS). */
  readonly upstreamTryTimeoutMs: number
  readonly upstreamTimeoutMs: number
  /** How often UPSTREAM_URL's host names are resolved again (UPSTREAM_DNS_REFRESH_MS). */
  readonly upstreamDnsRefreshMs: number
  /** UPSTREAM_DNS_SERVERS, as setServers takes them; absent: the system resolver (getaddrinfo). */
  readonly upstreamDnsServers?: readonly string[]
  /** The metrics listener's port on `host`; 0: no metrics listener. */
  readonly metricsPort: number
  readonly limits: LimitsConfig
  /** TRUST_PROXY: the peers whose X-Forwarded-For is believed; absent: none. */
  readonly trustProxy?: readonly string[]
  readonly uploads: UploadsConfig
  /** Absent: no OTLP endpoint set, tracing off. */
  readonly tracing?: TracingSettings
  readonly linger: LingerConfig
  readonly workers: number
}

export interface LingerConfig {
  readonly bodyFactor: number
  readonly maxSockets: number
  readonly maxPerAddress: number
}

/** UPLOAD_MAX_PER_USER and UPLOAD_MAX_CONNECTIONS (per engine endpoint). */
export interface UploadsConfig {
  readonly maxPerUser: number
  readonly maxConnections: number
}

export interface LimitsConfig {
  /** 0: no rate limit. */
  readonly ratePerMinute: number
  /** Unset: counters and records live in the process. */
  readonly redis?: RedisConfig
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
  const parsed = readChecked(env)
  const production = parsed.NODE_ENV === 'production'
  const jwt = jwtConfig(parsed, production)
  const upstreamUrls = parsed.UPSTREAM_URL === undefined ? undefined : upstreamOrigins(parsed.UPSTREAM_URL)
  const upstreamTryTimeoutMs = parsed.UPSTREAM_TRY_TIMEOUT_MS ?? Math.max(1, Math.floor(parsed.UPSTREAM_TIMEOUT_MS / 3))
  checkCombinations(parsed, production, upstreamTryTimeoutMs, upstreamUrls !== undefined)
  const trustProxy = parsed.TRUST_PROXY === undefined ? undefined : trustedProxies(parsed.TRUST_PROXY)
  const upstreamDnsServers =
    parsed.UPSTREAM_DNS_SERVERS === undefined ? undefined : dnsServers(parsed.UPSTREAM_DNS_SERVERS)
  const redis = redisConfigOf(parsed)
  if (!redis.ok) throw new ConfigError(redis.message)
  const tracing = tracingSettingsOf(parsed, 'portfolio-gateway', env)
  if (!tracing.ok) throw new ConfigError(tracing.message)
  if (parsed.GATEWAY_WORKERS > 1) checkWorkers(parsed, redis.value !== undefined, jwt.generated)
  return Object.freeze({
    production,
    port: parsed.PORT,
    host: parsed.HOST,
    logLevel: parsed.LOG_LEVEL,
    jwt: Object.freeze(jwt),
    ...(upstreamUrls === undefined ? {} : { upstreamUrl: upstreamUrls[0]!, upstreamUrls: Object.freeze(upstreamUrls) }),
    upstreamTryTimeoutMs,
    upstreamTimeoutMs: parsed.UPSTREAM_TIMEOUT_MS,
    upstreamDnsRefreshMs: parsed.UPSTREAM_DNS_REFRESH_MS,
    ...(upstreamDnsServers === undefined ? {} : { upstreamDnsServers }),
    metricsPort: parsed.METRICS_PORT,
    limits: limitsConfig(parsed, redis.value),
    ...(trustProxy === undefined ? {} : { trustProxy }),
    uploads: Object.freeze({ maxPerUser: parsed.UPLOAD_MAX_PER_USER, maxConnections: parsed.UPLOAD_MAX_CONNECTIONS }),
    ...(tracing.value === undefined ? {} : { tracing: tracing.value }),
    linger: Object.freeze({
      bodyFactor: parsed.LINGER_BODY_FACTOR,
      maxSockets: parsed.LINGER_MAX_SOCKETS,
      maxPerAddress: parsed.LINGER_MAX_PER_ADDRESS
    }),
    workers: parsed.GATEWAY_WORKERS
  })
}

/** The environment read against its schema; a bad value stops start-up with one line. */
function readChecked (env: Record<string, string | undefined>): Env {
  const read = readEnv(Env, env)
  if (read.ok) return read.value
  // Keys and secrets never reach a log or a terminal, even when they are wrong.
  const shown =
    read.name.startsWith('JWT_') || REDIS_SECRET_VARIABLES.has(read.name) || read.name.endsWith('_HEADERS')
      ? '(hidden)'
      : JSON.stringify(withoutCredentials(read.given))
  throw new ConfigError(`${read.name}=${shown} is invalid: ${read.problem}; expected ${read.expected}`)
}

/** Values each valid alone that cannot go together. */
function checkCombinations (parsed: Env, production: boolean, tryTimeoutMs: number, engineSet: boolean): void {
  if (tryTimeoutMs > parsed.UPSTREAM_TIMEOUT_MS) {
    throw new ConfigError(
      `UPSTREAM_TRY_TIMEOUT_MS=${tryTimeoutMs} is longer than UPSTREAM_TIMEOUT_MS=${parsed.UPSTREAM_TIMEOUT_MS}: ` +
        'one try lives within the call\'s deadline; set it lower, or leave it unset for a third'
    )
  }
  if (production && !engineSet) {
    // The embedded engine keeps its data in memory (decision: production means a real engine).
    throw new ConfigError(
      'NODE_ENV=production needs UPSTREAM_URL: ' +
        "set it to the engine's base URL, e.g. http://engine:4000 (the embedded engine keeps data in memory)"
    )
  }
  if (parsed.METRICS_PORT !== 0 && parsed.METRICS_PORT === parsed.PORT) {
    throw new ConfigError(
      `METRICS_PORT=${parsed.METRICS_PORT} is also PORT: metrics never ` +
        'share the public port; pick another port, or 0 to turn metrics off'
    )
  }
  if (parsed.LINGER_MAX_PER_ADDRESS > parsed.LINGER_MAX_SOCKETS) {
    const { LINGER_MAX_PER_ADDRESS: perAddress, LINGER_MAX_SOCKETS: all } = parsed
    throw new ConfigError(
      `LINGER_MAX_PER_ADDRESS=${perAddress} is more than LINGER_MAX_SOCKETS=${all}: ` +
        `one address cannot have more lingering connections than all of them; set it at most ${all}`
    )
  }
}

function limitsConfig (parsed: Env, redis: RedisConfig | undefined): LimitsConfig {
  return Object.freeze({
    ratePerMinute: parsed.RATE_LIMIT_PER_MINUTE,
    ...(redis === undefined ? {} : { redis: Object.freeze(redis) }),
    idempotencyTtlS: parsed.IDEMPOTENCY_TTL_S,
    shedEventLoopDelayMs: parsed.SHED_EVENT_LOOP_DELAY_MS,
    upstreamMaxQueue: parsed.UPSTREAM_MAX_QUEUE
  })
}

/** Whatever one worker keeps in memory the others do not see, so what must be shared lives outside them. */
function checkWorkers (env: Env, shared: boolean, generatedKey: boolean): void {
  const n = `GATEWAY_WORKERS=${env.GATEWAY_WORKERS}`
  if (!shared) {
    throw new ConfigError(
      `${n} needs Redis: each worker would keep rate limits and idempotency records of its own; ` +
        'set REDIS_URL (or REDIS_SENTINELS with REDIS_SENTINEL_NAME, or REDIS_CLUSTER_NODES), or GATEWAY_WORKERS=1'
    )
  }
  if (env.UPSTREAM_URL === undefined) {
    throw new ConfigError(
      `${n} needs UPSTREAM_URL: each worker would run an embedded engine with data of its own; ` +
        "set it to the engine's base URL, or GATEWAY_WORKERS=1"
    )
  }
  if (generatedKey) {
    throw new ConfigError(
      `${n} needs a JWT key: each worker would generate a secret of its own ` +
        "and refuse the others' tokens; set JWT_SECRET, JWT_PUBLIC_KEY or JWT_JWKS_URL, or GATEWAY_WORKERS=1"
    )
  }
  if (env.PORT === 0) {
    throw new ConfigError(
      `${n} with PORT=0: each worker would listen on a port of its own; ` + 'set PORT to the port they share'
    )
  }
  const last = env.METRICS_PORT + env.GATEWAY_WORKERS - 1
  if (env.METRICS_PORT !== 0 && last > 65535) {
    throw new ConfigError(
      `METRICS_PORT=${env.METRICS_PORT} with ${n}: worker i serves metrics on METRICS_PORT + i, ` +
        `up to ${last}; pick a METRICS_PORT of at most ${65536 - env.GATEWAY_WORKERS}, or 0 to turn metrics off`
    )
  }
  if (env.METRICS_PORT !== 0 && env.PORT >= env.METRICS_PORT && env.PORT <= last) {
    throw new ConfigError(
      `PORT=${env.PORT} is one of the workers' metrics ports ` +
        `(METRICS_PORT + i, ${env.METRICS_PORT}-${last}): ` +
        'metrics never share the public port; pick a PORT outside that range or another METRICS_PORT'
    )
  }
}

/** TRUST_PROXY as a list of addresses and CIDRs, each checked here so a typo stops start-up with one line. */
function trustedProxies (text: string): readonly string[] {
  const entries = text.split(',').map((entry) => entry.trim())
  const bad = entries.find((entry) => !isAddressOrCidr(entry))
  if (bad !== undefined) {
    throw new ConfigError(
      `TRUST_PROXY=${JSON.stringify(text)} is invalid: ${JSON.stringify(bad)} is not an IP address or ` +
        'CIDR; expected comma-separated addresses or CIDRs of the load balancers, e.g. 10.0.0.0/8,fd00::/8'
    )
  }
  return Object.freeze(entries)
}

/** Addresses only: a server given by name would need a resolver to find the resolver. */
function dnsServers (text: string): readonly string[] {
  const entries = text.split(',').map((entry) => entry.trim())
  const bad = entries.find((entry) => !isDnsServer(entry))
  if (bad !== undefined) {
    throw new ConfigError(
      `UPSTREAM_DNS_SERVERS=${JSON.stringify(text)} is invalid: ` +
        `${JSON.stringify(bad)} is not an IP address with an optional port 1-65535; ` +
        'expected comma-separated ip or ip:port, IPv6 as [ip]:port, e.g. 10.96.0.10,127.0.0.1:5353'
    )
  }
  return Object.freeze(entries)
}

function isDnsServer (entry: string): boolean {
  const m = /^(?:\[([^\]]+)\]|([^:[\]]+))(?::(\d{1,5}))?$/.exec(entry)
  if (m === null) return isIP(entry) === 6 // a bare IPv6 address, no port
  const port = m[3]
  if (port !== undefined && (Number(port) < 1 || Number(port) > 65535)) return false
  return m[1] !== undefined ? isIP(m[1]) === 6 : isIP(m[2]!) === 4
}

function isAddressOrCidr (entry: string): boolean {
  const slash = entry.indexOf('/')
  const version = isIP(slash === -1 ? entry : entry.slice(0, slash))
  if (version === 0) return false
  if (slash === -1) return true
  const bits = entry.slice(slash + 1)
  return /^\d{1,3}$/.test(bits) && Number(bits) <= (version === 4 ? 32 : 128)
}

/** `user:password@` in a URL, as far as a message may quote it. */
function withoutCredentials (text: string): string {
  return text.replace(/^([a-z][a-z0-9+.-]*:\/\/)[^/?#]*@/i, '$1(credentials hidden)@')
}

/**
 * Read as undici's WHATWG parser reads it, so a bad port is one line, not a stack trace from `new Pool`; credentials
 * are refused because the URL is logged.
 */
function upstreamOrigin (text: string): string {
  if (withoutCredentials(text) !== text) {
    throw new ConfigError(
      'UPSTREAM_URL must not hold credentials (user:password@): ' +
        'the URL is logged; remove them and let the network or a proxy authenticate the gateway'
    )
  }
  const port = /:(\d+)\/?$/.exec(text)?.[1]
  if (port !== undefined && (Number(port) < 1 || Number(port) > 65535)) {
    throw new ConfigError(
      `UPSTREAM_URL=${JSON.stringify(text)} is invalid: port ${port} ` +
        'is out of range; use a port from 1 to 65535, or none for 80/443'
    )
  }
  if (!URL.canParse(text)) {
    throw new ConfigError(
      `UPSTREAM_URL=${JSON.stringify(text)} is invalid: not a URL; ` +
        'expected base URL of the engine, http(s)://host:port with no path'
    )
  }
  return new URL(text).origin
}

/** None twice: the same engine twice would get twice the share and be ejected twice. */
function upstreamOrigins (text: string): string[] {
  const origins = text.split(',').map((part) => upstreamOrigin(part.trim()))
  const twice = origins.find((o, i) => origins.indexOf(o) !== i)
  if (twice !== undefined) {
    throw new ConfigError(
      `UPSTREAM_URL lists ${twice} twice: each engine endpoint once, ` +
        'comma-separated, e.g. http://engine-a:4000,http://engine-b:4000'
    )
  }
  return origins
}

/** What a key set from an identity provider needs besides its URL; returns the issuer its tokens must name. */
function checkedJwksIssuer (env: Env, jwksUrl: string, production: boolean): string {
  if (env.JWT_ISSUER === undefined) {
    throw new ConfigError(
      "JWT_ISSUER is required with JWT_JWKS_URL: set it to the provider's issuer, the `iss` of its tokens"
    )
  }
  if (production && env.JWT_AUDIENCE === undefined) {
    throw new ConfigError(
      'JWT_AUDIENCE is required with JWT_JWKS_URL in production: ' +
        'set it to the API identifier your provider puts in `aud`'
    )
  }
  // Whoever can change the key set on its way can sign any token.
  if (production && !isHttpsOrLoopback(jwksUrl)) {
    throw new ConfigError(
      'JWT_JWKS_URL must be https in production: ' +
        'a key set fetched over plain http can be replaced on the way, and with it every token; ' +
        "use the provider's https URL (or a TLS proxy on 127.0.0.1)"
    )
  }
  return env.JWT_ISSUER
}

function jwtConfig (env: Env, production: boolean): JwtConfig {
  const claims = {
    ...(env.JWT_ISSUER === undefined ? {} : { issuer: env.JWT_ISSUER }),
    ...(env.JWT_AUDIENCE === undefined ? {} : { audience: env.JWT_AUDIENCE }),
    clockToleranceS: env.JWT_CLOCK_TOLERANCE_S
  }
  // Exactly one key source (decision: tokens from an identity provider).
  const sources = (['JWT_SECRET', 'JWT_PUBLIC_KEY', 'JWT_JWKS_URL'] as const).filter((name) => env[name] !== undefined)
  if (sources.length > 1) {
    throw new ConfigError(
      `${sources.join(' and ')} are ${sources.length === 2 ? 'both' : 'all'} set: ` +
        'set exactly one key source (JWT_SECRET, JWT_PUBLIC_KEY or JWT_JWKS_URL)'
    )
  }
  if (env.JWT_JWKS_URL !== undefined) {
    const issuer = checkedJwksIssuer(env, env.JWT_JWKS_URL, production)
    return {
      source: 'jwks',
      jwksUrl: env.JWT_JWKS_URL,
      jwksCooldownS: env.JWT_JWKS_COOLDOWN_S,
      generated: false,
      ...claims,
      issuer
    }
  }
  if (env.JWT_PUBLIC_KEY !== undefined) {
    // Container environments often carry a PEM on one line with literal "\n".
    const pem = env.JWT_PUBLIC_KEY.replace(/\\n/g, '\n')
    return { source: 'static', key: pem, algorithm: publicKeyAlgorithm(pem), generated: false, ...claims }
  }
  if (env.JWT_SECRET !== undefined) {
    return { source: 'static', key: env.JWT_SECRET, algorithm: 'HS256', generated: false, ...claims }
  }
  if (production) {
    throw new ConfigError(
      'NODE_ENV=production needs a JWT key: set JWT_SECRET (HS256, 32+ characters), ' +
        'JWT_PUBLIC_KEY (PEM, RS256/ES256) or JWT_JWKS_URL (your identity provider)'
    )
  }
  return {
    source: 'static',
    key: randomBytes(32).toString('base64url'),
    algorithm: 'HS256',
    generated: true,
    ...claims
  }
}

/** https, or plain http to this machine (a local TLS sidecar or proxy). */
function isHttpsOrLoopback (url: string): boolean {
  if (!URL.canParse(url)) return false
  const { protocol, hostname } = new URL(url)
  return (
    protocol === 'https:' || hostname === 'localhost' || hostname === '[::1]' || /^127(\.\d{1,3}){3}$/.test(hostname)
  )
}

/** The algorithm is pinned by the key's type: an RSA key only verifies RS256, a P-256 key only ES256. */
function publicKeyAlgorithm (pem: string): JwtAlgorithm {
  // createPublicKey derives the public half from a private key without a word:
  // a private key here is a secret in the wrong place, not a configuration to accept.
  if (isPrivateKey(pem)) {
    throw new ConfigError(
      'JWT_PUBLIC_KEY holds a private key: pass the public key (-----BEGIN PUBLIC KEY-----, ' +
        'e.g. from openssl pkey -in key.pem -pubout) and keep the private key with the token issuer'
    )
  }
  let key
  try {
    key = createPublicKey(pem)
  } catch {
    throw new ConfigError(
      'JWT_PUBLIC_KEY is not a PEM public key: pass the text of the key, starting with -----BEGIN PUBLIC KEY-----'
    )
  }
  if (key.asymmetricKeyType === 'rsa') return 'RS256'
  if (key.asymmetricKeyType === 'ec' && key.asymmetricKeyDetails?.namedCurve === 'prime256v1') return 'ES256'
  const what =
    key.asymmetricKeyType === 'ec'
      ? `an EC key on curve ${key.asymmetricKeyDetails?.namedCurve ?? 'unknown'}`
      : `a key of type ${key.asymmetricKeyType ?? 'unknown'}`
  throw new ConfigError(`JWT_PUBLIC_KEY is ${what}: use an RSA key (RS256) or a P-256 EC key (ES256)`)
}

function isPrivateKey (pem: string): boolean {
  try {
    createPrivateKey(pem)
    return true
  } catch {
    return false
  }
}
