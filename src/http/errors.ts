/** The error catalogue: a GatewayError's code decides its status and its shape (spec "Errors"). */
import { errors as undiciErrors } from 'undici'
import type { SimpleError, StructuredError } from '../../schemas/errors.js'

/** `error.source` of every structured error the gateway itself produces. */
export const GATEWAY_SOURCE = 'portfolio-gateway'

type Shape = 'simple' | 'structured'

/** One line per error: status, wire shape, default message. */
export const CATALOGUE = {
  VALIDATION_ERROR: { status: 400, shape: 'structured', message: 'request is invalid' },
  UNAUTHORIZED: { status: 401, shape: 'simple', message: 'missing or invalid token' },
  ROUTE_NOT_FOUND: { status: 404, shape: 'simple', message: 'route not found' },
  AUTH_PROVIDER_UNAVAILABLE: { status: 503, shape: 'simple', message: 'identity provider unavailable, retry later' },
  INTERNAL_ERROR: { status: 500, shape: 'structured', message: 'internal error' },
  UPSTREAM_UNAVAILABLE: { status: 502, shape: 'simple', message: 'portfolio engine unavailable' },
  UPSTREAM_BAD_RESPONSE: { status: 502, shape: 'simple', message: 'portfolio engine sent an invalid response' },
  UPSTREAM_TIMEOUT: { status: 504, shape: 'simple', message: 'portfolio engine timed out' },
  RATE_LIMITED: { status: 429, shape: 'simple', message: 'rate limit exceeded' },
  OVERLOADED: { status: 503, shape: 'simple', message: 'gateway is overloaded, retry later' },
  IDEMPOTENCY_STORE_UNAVAILABLE: {
    status: 503,
    shape: 'simple',
    message: 'idempotency store unavailable, retry later'
  },
  IDEMPOTENCY_KEY_IN_USE: {
    status: 409,
    shape: 'structured',
    message: 'a request with this Idempotency-Key is still in progress'
  },
  IDEMPOTENCY_KEY_REUSED: {
    status: 422,
    shape: 'structured',
    message: 'this Idempotency-Key was used for a different request'
  },
  TOO_MANY_UPLOADS: { status: 429, shape: 'simple', message: 'too many uploads at once' },
  UPLOADS_BUSY: { status: 503, shape: 'simple', message: 'too many uploads in progress, retry later' },
  UPLOAD_TIMEOUT: { status: 408, shape: 'simple', message: 'upload too slow' },
  METHOD_NOT_ALLOWED: { status: 405, shape: 'simple', message: 'method not allowed' },
  UPSTREAM_RETRY_LATER: { status: 503, shape: 'simple', message: 'portfolio engine unavailable, retry later' }
} as const satisfies Record<string, { status: number; shape: Shape; message: string }>

export type ErrorCode = keyof typeof CATALOGUE

export class GatewayError extends Error {
  override name = 'GatewayError'
  readonly code: ErrorCode
  readonly statusCode: number
  /** Response headers that belong to this error (Retry-After, RateLimit). */
  readonly headers: Readonly<Record<string, string>>

  constructor (
    code: ErrorCode,
    message: string = CATALOGUE[code].message,
    options?: { cause?: unknown; headers?: Record<string, string> }
  ) {
    super(message, options)
    this.code = code
    this.statusCode = CATALOGUE[code].status
    this.headers = options?.headers ?? {}
  }
}

export const validationError = (message: string): GatewayError => new GatewayError('VALIDATION_ERROR', message)

/** RFC 6750 section 3: the challenge of a request that sent no bearer token (none, or another scheme). */
export const BEARER_CHALLENGE = 'Bearer'
/** RFC 6750 section 3.1: a token was sent and refused; why stays in the log (decision: identity). */
export const INVALID_TOKEN_CHALLENGE = 'Bearer error="invalid_token"'

/** A 401 with its challenge: `invalid_token` unless no bearer token was sent at all. */
export const unauthorized = (message: string, challenge: string = INVALID_TOKEN_CHALLENGE): GatewayError =>
  new GatewayError('UNAUTHORIZED', message, { headers: { 'www-authenticate': challenge } })

/** A route without a handler name (health, ping) answers the simple shape, as the spec does outside portfolio. */
export function wireBody (err: GatewayError, handler: string | undefined): SimpleError | StructuredError {
  if (CATALOGUE[err.code].shape === 'structured' && handler !== undefined) {
    return {
      success: false,
      error: { source: GATEWAY_SOURCE, code: err.code, message: err.message, function: handler }
    }
  }
  return { error: err.message }
}

/** Grouped by what they mean for the client; undici's advice is to match on `err.code`, never the class. */
const UNREACHABLE = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'EPIPE',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ETIMEDOUT',
  'UND_ERR_CONNECT_TIMEOUT',
  'UND_ERR_SOCKET',
  'UND_ERR_CLOSED',
  'UND_ERR_DESTROYED'
])
const TIMED_OUT = new Set(['UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT'])

/** The engine answered, but not HTTP we can trust; the other UND_ERR_* codes are our own doing, a 500. */
const BAD_RESPONSE = new Set([
  'UND_ERR_HEADERS_OVERFLOW',
  'UND_ERR_RES_CONTENT_LENGTH_MISMATCH',
  'UND_ERR_RES_EXCEEDED_MAX_SIZE',
  'UND_ERR_INFO'
])

/** Map any failure of an engine call to the error the client gets; the original stays as `cause`. */
export function upstreamError (err: unknown): GatewayError {
  if (err instanceof GatewayError) return err
  const code = typeof err === 'object' && err !== null && 'code' in err ? String(err.code) : ''
  if (TIMED_OUT.has(code)) return new GatewayError('UPSTREAM_TIMEOUT', undefined, { cause: err })
  if (UNREACHABLE.has(code)) return new GatewayError('UPSTREAM_UNAVAILABLE', undefined, { cause: err })
  if (err instanceof undiciErrors.HTTPParserError || code.startsWith('HPE_') || BAD_RESPONSE.has(code)) {
    return new GatewayError('UPSTREAM_BAD_RESPONSE', undefined, { cause: err })
  }
  // Any other system error on the engine's socket (EPROTO, ECONNABORTED, ...): it could not be reached.
  if (/^E[A-Z]+$/.test(code)) return new GatewayError('UPSTREAM_UNAVAILABLE', undefined, { cause: err })
  return new GatewayError('INTERNAL_ERROR', undefined, { cause: err })
}
