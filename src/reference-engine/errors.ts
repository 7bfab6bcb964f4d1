/** The engine's error catalogue and its wire shape; it imports nothing else of the engine, which all throws these. */
import type { StructuredError } from '../../schemas/errors.js'
import { LIMITS } from '../../schemas/portfolio.js'
import { clientErrorMessage } from '../shared/client-errors.js'

export const ENGINE_ERRORS = Object.freeze({
  VALIDATION_ERROR: 400,
  UNAUTHORIZED: 401,
  NOT_FOUND: 404,
  /** This owner's Idempotency-Key created a portfolio from a different form. */
  IDEMPOTENCY_KEY_REUSED: 422,
  INTERNAL_ERROR: 500,
  /** The store cannot be reached or timed out: a retry with its Idempotency-Key may succeed, never twice. */
  SERVICE_UNAVAILABLE: 503
})
export type EngineErrorCode = keyof typeof ENGINE_ERRORS

/** Shown for every 5xx: internals (paths, stack, driver messages) stay in the log. */
export const INTERNAL_ERROR_MESSAGE = 'Internal error'
/** As the gateway words it: one reused key reads the same from either side. */
export const KEY_REUSED_MESSAGE = 'this Idempotency-Key was used for a different request'
export const STORE_UNAVAILABLE_MESSAGE = 'portfolio store unavailable, retry later'
/** Sent with SERVICE_UNAVAILABLE: the store reconnects within about a second. */
export const STORE_RETRY_AFTER_S = 1

/** The store cannot be reached or answered too late: answered 503 SERVICE_UNAVAILABLE. */
export class StoreUnavailableError extends Error {
  override name = 'StoreUnavailableError'
  /** True when the command may have run (a timeout, a connection lost mid-command). */
  readonly maybeWritten: boolean

  constructor (message: string, maybeWritten: boolean, options?: ErrorOptions) {
    super(message, options)
    this.maybeWritten = maybeWritten
  }
}

/** An error the engine means to answer with; anything else is a 500. */
export class EngineError extends Error {
  override name = 'EngineError'
  readonly code: EngineErrorCode
  readonly statusCode: number

  constructor (code: EngineErrorCode, message: string, options?: ErrorOptions) {
    super(message, options)
    this.code = code
    this.statusCode = ENGINE_ERRORS[code]
  }
}

export function validationError (message: string, cause?: unknown): EngineError {
  return new EngineError('VALIDATION_ERROR', message, cause === undefined ? undefined : { cause })
}

export function structuredError (source: string, fn: string, code: EngineErrorCode, message: string): StructuredError {
  return { success: false, error: { source, code, message, function: fn } }
}

interface ErrorLike { code?: unknown, statusCode?: unknown, message?: unknown }

/**
 * Whatever a handler or Fastify threw, in the catalogue: every client mistake is 400 VALIDATION_ERROR, since the
 * contract knows no other 4xx for bad input, and anything else a 500 whose message hides the cause.
 */
export function toEngineError (err: unknown): EngineError {
  if (err instanceof EngineError) return err
  if (err instanceof StoreUnavailableError) {
    return new EngineError('SERVICE_UNAVAILABLE', STORE_UNAVAILABLE_MESSAGE, { cause: err })
  }
  const e: ErrorLike = typeof err === 'object' && err !== null ? err : {}
  const status = typeof e.statusCode === 'number' ? e.statusCode : 500
  if (status >= 400 && status < 500) {
    const known = typeof e.code === 'string' ? clientErrorMessage(e.code, LIMITS.updateBodyMaxBytes) : undefined
    const message = known ?? (typeof e.message === 'string' && e.message !== '' ? e.message : 'invalid request')
    return validationError(message, err)
  }
  return new EngineError('INTERNAL_ERROR', INTERNAL_ERROR_MESSAGE, { cause: err })
}
