/**
 * Reading the engine's answers against the upstream contract (DECISIONS 8):
 * the agreed 2xx body goes to the client as the engine sent it, the engine's
 * own structured errors pass through unchanged, and anything else is a 502.
 */
import type { FastifyReply } from 'fastify'
import type { StructuredError } from '../../schemas/errors.js'
import { isEngineError } from '../../schemas/upstream.js'
import type { EngineResponse } from './types.js'
import { GatewayError } from '../http/errors.js'

const JSON_TYPE = 'application/json; charset=utf-8'

/** The engine's JSON body, or undefined when it is not JSON. */
export function parseJson (answer: EngineResponse): unknown {
  if (!answer.contentType.startsWith('application/json')) return undefined
  try {
    return JSON.parse(answer.body.toString('utf8'))
  } catch {
    return undefined
  }
}

function badResponse (answer: EngineResponse, expected: string): GatewayError {
  return new GatewayError('UPSTREAM_BAD_RESPONSE', undefined, {
    cause: new Error(`engine answered ${answer.status} ${answer.contentType || '(no content-type)'}, expected ${expected}`)
  })
}

/**
 * Send a JSON answer of the engine that assertEngineJson has passed: the
 * engine's bytes as they are, checked, never re-encoded. Between the two a
 * route may store the answer (an Idempotency-Key record).
 */
export function sendEngineJson (reply: FastifyReply, answer: EngineResponse): FastifyReply {
  return reply.code(answer.status).type(JSON_TYPE).send(answer.body)
}

/** The statuses of the engine's structured errors that a create passes on (the upstream contract). */
export const CREATE_ENGINE_ERRORS: ReadonlySet<number> = new Set([400, 422, 500])
/** An update can also name a portfolio that is not there (DECISIONS 1). */
export const UPDATE_ENGINE_ERRORS: ReadonlySet<number> = new Set([400, 404, 422, 500])
/** A ping has no input to refuse. */
export const PING_ENGINE_ERRORS: ReadonlySet<number> = new Set([500])

/** Delta-seconds (RFC 9110 10.2.3); an HTTP-date or nothing becomes the engine store's usual second. */
function retryAfterOf (answer: EngineResponse): string {
  return answer.retryAfter !== undefined && /^\d{1,9}$/.test(answer.retryAfter) ? answer.retryAfter : '1'
}

/**
 * Throw unless the answer is the agreed 200 body (`isAgreed`) or the engine's
 * structured error with a status the route declares (`errors`): anything else
 * is a 502. The engine's 503 (its store is away) becomes the gateway's simple
 * 503, as every 503 is, with the engine's Retry-After.
 */
export function assertEngineJson (
  answer: EngineResponse, isAgreed: (value: unknown) => boolean, expected: string, errors = CREATE_ENGINE_ERRORS
): void {
  const payload = parseJson(answer)
  if (answer.status === 200 ? isAgreed(payload) : errors.has(answer.status) && isEngineError.Check(payload)) return
  if (answer.status === 503 && isEngineError.Check(payload)) {
    throw new GatewayError('UPSTREAM_RETRY_LATER', undefined, {
      headers: { 'retry-after': retryAfterOf(answer) },
      cause: new Error(`engine answered 503 ${(payload as StructuredError).error.code}`)
    })
  }
  throw badResponse(answer, expected)
}

/** The ping answer is text: 200 `pong`, or the engine's structured error. */
export function sendEnginePong (reply: FastifyReply, answer: EngineResponse): FastifyReply {
  if (answer.status === 200 && answer.contentType.startsWith('text/plain') && answer.body.toString('latin1') === 'pong') {
    return reply.code(200).type('text/plain; charset=utf-8').send('pong')
  }
  assertEngineJson(answer, () => false, '200 text/plain pong', PING_ENGINE_ERRORS)
  return sendEngineJson(reply, answer)
}
