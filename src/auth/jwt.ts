/**
 * Bearer JWT authentication (spec "Authentication"; DECISIONS 9).
 *
 * @fastify/jwt (fast-jwt underneath) verifies the signature with the one
 * configured algorithm, `exp`, `nbf`, and `iss`/`aud` when configured.
 * Verified identities are cached by token in a bounded LRU, and an entry never
 * outlives the token's `exp`: a verification costs ~12 µs, a cache hit ~0.3 µs.
 */
import fastifyJwt from '@fastify/jwt'
import type { FastifyInstance, FastifyReply, FastifyRequest, onRequestHookHandler } from 'fastify'
import { LRUCache } from 'lru-cache'
import type { JwtConfig } from '../config.js'
import { unauthorized } from '../http/errors.js'
import { SANE_SUBJECT } from '../shared/subject.js'

declare module 'fastify' {
  interface FastifyRequest {
    /** The verified token's `sub`: the only identity the engine ever sees. */
    userId: string
  }
}

export interface AuthOptions {
  jwt: JwtConfig
  /** Verified tokens kept; each entry is a token string and a short id. */
  cacheSize?: number
  /** Upper bound on how long a verification is trusted, whatever the token's `exp`. */
  cacheMaxAgeMs?: number
}

const BEARER = /^Bearer +([A-Za-z0-9_.~+/=-]+) *$/i

/** What fast-jwt's error codes mean to the client. The token itself is never echoed. */
const REASONS: Record<string, string> = {
  FAST_JWT_EXPIRED: 'token expired',
  FAST_JWT_INACTIVE: 'token not yet valid',
  FAST_JWT_MISSING_REQUIRED_CLAIM: 'token lacks a required claim (sub, exp, and iss/aud when configured)',
  FAST_JWT_INVALID_CLAIM_VALUE: 'token issuer or audience not accepted'
}

interface Identity { userId: string }

/**
 * Register @fastify/jwt on `app` and return the onRequest hook that guards a
 * scope. The hook ends the request with 401 before the body is read or any
 * handler runs.
 */
export async function registerAuth (app: FastifyInstance, opts: AuthOptions): Promise<onRequestHookHandler> {
  const { jwt } = opts
  await app.register(fastifyJwt, {
    secret: jwt.algorithm === 'HS256' ? jwt.key : { public: jwt.key },
    verify: {
      algorithms: [jwt.algorithm],
      // fast-jwt checks allowedIss/allowedAud only when the claim is present, so require it too.
      requiredClaims: ['sub', 'exp', ...(jwt.issuer === undefined ? [] : ['iss']), ...(jwt.audience === undefined ? [] : ['aud'])],
      ...(jwt.issuer === undefined ? {} : { allowedIss: jwt.issuer }),
      ...(jwt.audience === undefined ? {} : { allowedAud: jwt.audience })
    },
    ...(jwt.algorithm === 'HS256' ? { sign: { algorithm: 'HS256' } } : {})
  })

  const maxAge = opts.cacheMaxAgeMs ?? 5 * 60_000
  const cache = new LRUCache<string, Identity>({ max: opts.cacheSize ?? 10_000 })

  function verify (token: string): Identity {
    let payload: { sub?: unknown, exp?: unknown }
    try {
      payload = app.jwt.verify(token)
    } catch (err) {
      const code = (err as { code?: string }).code ?? ''
      throw unauthorized(REASONS[code] ?? 'invalid token')
    }
    if (typeof payload.sub !== 'string' || !SANE_SUBJECT.test(payload.sub)) {
      throw unauthorized('token sub claim must be 1-256 printable characters')
    }
    const identity = { userId: payload.sub }
    // fast-jwt has checked that exp is a number in the future.
    const ttl = Math.min(maxAge, (payload.exp as number) * 1000 - Date.now())
    if (ttl > 0) cache.set(token, identity, { ttl })
    return identity
  }

  return function authenticate (request: FastifyRequest, _reply: FastifyReply, done: (err?: Error) => void): void {
    const header = request.headers.authorization
    if (header === undefined) return done(unauthorized('missing bearer token'))
    const match = BEARER.exec(header)
    if (match === null) return done(unauthorized('authorization header must be: Bearer <token>'))
    const token = match[1]!
    let identity = cache.get(token)
    if (identity === undefined) {
      try {
        identity = verify(token)
      } catch (err) {
        return done(err as Error)
      }
    }
    request.userId = identity.userId
    done()
  }
}
