/**
 * Bearer JWT authentication (decisions: identity; tokens from an identity provider): a static key verified by
 * @fastify/jwt, or the provider's key set, where the token's `kid` picks a key that pins the algorithm. A cached
 * verification is dropped as soon as its key leaves the set, so a revoked key is distrusted at once.
 */
import fastifyJwt from '@fastify/jwt'
import type { FastifyBaseLogger, FastifyInstance, FastifyReply, FastifyRequest, onRequestHookHandler } from 'fastify'
import { decodeProtectedHeader, jwtVerify, type JWTPayload } from 'jose'
import type { JwtConfig, JwtKeySetConfig, JwtStaticKeyConfig } from '../config.js'
import { BEARER_CHALLENGE, GatewayError, unauthorized } from '../http/errors.js'
import { KeyNotFound, KeySet, type KeySetOptions, type SigningKey } from './key-set.js'
import type { KeySetMetrics } from '../observability/metrics.js'
import { TokenCache } from './token-cache.js'
import { SANE_SUBJECT } from '../shared/subject.js'

declare module 'fastify' {
  interface FastifyRequest {
    /** The verified token's `sub`: the only identity the engine ever sees. */
    userId: string
  }
}

export interface AuthOptions {
  jwt: JwtConfig
  cacheSize?: number
  /** Upper bound on how long a verification is trusted, whatever the token's `exp`. */
  cacheMaxAgeMs?: number
  /** Required in key-set mode. */
  keySet?: KeySet
}

export type KeySetBounds = Partial<Pick<KeySetOptions, 'timeoutMs' | 'maxBodyBytes' | 'minMaxAgeMs'>>

const BEARER = /^Bearer +([A-Za-z0-9_.~+/=-]+) *$/i
const BEARER_SCHEME = /^Bearer(?: |$)/i

/** The token itself is never echoed. */
const MISSING_CLAIM = 'token lacks a required claim (sub, exp, and iss/aud when configured)'
const REASONS: Record<string, string> = {
  FAST_JWT_EXPIRED: 'token expired',
  FAST_JWT_INACTIVE: 'token not yet valid',
  FAST_JWT_MISSING_REQUIRED_CLAIM: MISSING_CLAIM,
  FAST_JWT_INVALID_CLAIM_VALUE: 'token issuer or audience not accepted',
  ERR_JWT_EXPIRED: 'token expired'
}

function joseReason (err: unknown): string {
  const { code, claim, reason } = err as { code?: string, claim?: string, reason?: string }
  if (code === 'ERR_JWT_CLAIM_VALIDATION_FAILED') {
    if (reason === 'missing') return MISSING_CLAIM
    if (claim === 'nbf') return 'token not yet valid'
    if (claim === 'iss' || claim === 'aud') return 'token issuer or audience not accepted'
  }
  return REASONS[code ?? ''] ?? 'invalid token'
}

interface Identity { userId: string, validUntilMs: number, key?: SigningKey }

function identityOf (payload: { sub?: unknown, exp?: unknown }, toleranceS: number): Identity {
  if (typeof payload.sub !== 'string' || !SANE_SUBJECT.test(payload.sub)) {
    throw unauthorized('token sub claim must be 1-256 printable characters')
  }
  // Both verifiers have checked that exp is a number not yet past (with the tolerance).
  return { userId: payload.sub, validUntilMs: ((payload.exp as number) + toleranceS) * 1000 }
}

/** The onRequest hook answers before the body is read or any handler runs. */
export async function createAuthenticator (app: FastifyInstance, opts: AuthOptions): Promise<onRequestHookHandler> {
  const cache = new TokenCache<SigningKey>({
    ...(opts.cacheSize === undefined ? {} : { max: opts.cacheSize }),
    ...(opts.cacheMaxAgeMs === undefined ? {} : { maxAgeMs: opts.cacheMaxAgeMs })
  })
  const verifier: Verifier = opts.jwt.source === 'jwks'
    ? keySetVerifier(opts.jwt, keySetOf(opts))
    : await staticKeyVerifier(app, opts.jwt)

  return function authenticate (request: FastifyRequest, reply: FastifyReply, done: (err?: Error) => void): void {
    const header = request.headers.authorization
    if (header === undefined) return done(unauthorized('missing bearer token', BEARER_CHALLENGE))
    const match = BEARER.exec(header)
    if (match === null) {
      // Another scheme (Basic) sent no bearer token: the bare challenge says which scheme to use.
      const challenge = BEARER_SCHEME.test(header) ? undefined : BEARER_CHALLENGE
      return done(unauthorized('authorization header must be: Bearer <token>', challenge))
    }
    const token = match[1]!
    const cached = cache.get(token)
    if (cached !== undefined && (cached.key === undefined || verifier.trusts(cached.key))) {
      request.userId = cached.userId
      return done()
    }
    let verified: Identity | Promise<Identity>
    try {
      verified = verifier.verify(token)
    } catch (err) {
      return done(err as Error)
    }
    if (verified instanceof Promise) verified.then(accept, refuse)
    else accept(verified)

    function accept (identity: Identity): void {
      const { userId, key } = identity
      cache.set(token, key === undefined ? { userId } : { userId, key }, identity.validUntilMs)
      request.userId = identity.userId
      done()
    }
    function refuse (err: unknown): void {
      if (err instanceof KeyNotFound && err.retryAfterS !== undefined) {
        // The provider is down: 503, never 401, which would make apps log users out.
        reply.header('retry-after', String(err.retryAfterS))
        request.log.warn({ retryAfterS: err.retryAfterS },
          'token refused: its key cannot be had, identity provider unreachable')
        return done(new GatewayError('AUTH_PROVIDER_UNAVAILABLE'))
      }
      done(err instanceof GatewayError ? err : unauthorized(err instanceof KeyNotFound ? err.message : 'invalid token'))
    }
  }
}

interface Verifier {
  verify: (token: string) => Identity | Promise<Identity>
  /** False once a cached verification's key has left the key set. */
  trusts: (key: SigningKey) => boolean
}

async function staticKeyVerifier (app: FastifyInstance, jwt: JwtStaticKeyConfig): Promise<Verifier> {
  await app.register(fastifyJwt, {
    secret: jwt.algorithm === 'HS256' ? jwt.key : { public: jwt.key },
    verify: {
      algorithms: [jwt.algorithm],
      // fast-jwt checks allowedIss/allowedAud only when the claim is present, so require it too.
      requiredClaims: [
        'sub', 'exp', ...(jwt.issuer === undefined ? [] : ['iss']), ...(jwt.audience === undefined ? [] : ['aud'])
      ],
      clockTolerance: jwt.clockToleranceS * 1000,
      ...(jwt.issuer === undefined ? {} : { allowedIss: jwt.issuer }),
      ...(jwt.audience === undefined ? {} : { allowedAud: jwt.audience })
    },
    ...(jwt.algorithm === 'HS256' ? { sign: { algorithm: 'HS256' } } : {})
  })
  return {
    verify: (token) => {
      let payload: { sub?: unknown, exp?: unknown }
      try {
        payload = app.jwt.verify(token)
      } catch (err) {
        const code = (err as { code?: string }).code ?? ''
        throw unauthorized(REASONS[code] ?? 'invalid token')
      }
      return identityOf(payload, jwt.clockToleranceS)
    },
    trusts: () => true
  }
}

export interface KeySetDeps { log: FastifyBaseLogger, metrics: KeySetMetrics, bounds?: KeySetBounds | undefined }

/** Fetched before the gateway listens; a provider down at start is logged, not fatal. */
export async function loadKeySet (jwt: JwtKeySetConfig, deps: KeySetDeps): Promise<KeySet> {
  const { log, metrics, bounds } = deps
  const keySet = new KeySet({ url: jwt.jwksUrl, cooldownMs: jwt.jwksCooldownS * 1000, log, metrics, ...bounds })
  await keySet.refresh()
  if (!keySet.ready) {
    log.warn({ url: jwt.jwksUrl }, 'key set unavailable at start: bearer routes answer 503 until it can be fetched')
  }
  return keySet
}

function keySetOf (opts: AuthOptions): KeySet {
  if (opts.keySet === undefined) throw new Error('JWT_JWKS_URL is set but no key set was loaded: pass loadKeySet()\'s')
  return opts.keySet
}

function keySetVerifier (jwt: JwtKeySetConfig, keySet: KeySet): Verifier {
  const options = {
    issuer: jwt.issuer,
    ...(jwt.audience === undefined ? {} : { audience: jwt.audience }),
    clockTolerance: jwt.clockToleranceS,
    requiredClaims: ['sub', 'exp']
  }
  return {
    verify: async (token) => {
      let kid: string | undefined
      try {
        const header = decodeProtectedHeader(token)
        kid = typeof header.kid === 'string' ? header.kid : undefined
      } catch {
        throw unauthorized('invalid token')
      }
      const key = await keySet.keyFor(kid)
      let payload: JWTPayload
      try {
        // The key pins the one algorithm: HS256 or another family under an RSA kid fails here.
        ({ payload } = await jwtVerify(token, key.key, { ...options, algorithms: [key.alg] }))
      } catch (err) {
        throw unauthorized(joseReason(err))
      }
      return { ...identityOf(payload, jwt.clockToleranceS), key }
    },
    trusts: (key) => keySet.trusts(key)
  }
}
