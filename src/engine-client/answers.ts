/** The engine's answers read against the upstream contract (decision: what the client gets when the engine fails):
 * anything outside it is a 502.
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
    cause: new Error(`engine answered ${answer.status} ` +
      `${answer.contentType || '(no content-type)'}, expected ${expected}`)
  })
}

/** Send a JSON answer assertEngineJson has passed: the engine's bytes as they are, never re-encoded. */
export function sendEngineJson (reply: FastifyReply, answer: EngineResponse): FastifyReply {
  return reply.code(answer.status).type(JSON_TYPE).send(answer.body)
}

/** The engine's structured errors a route passes on: by status, the codes the document declares for it. */
export type EngineErrors = ReadonlyMap<number, ReadonlySet<string>>

/** An hour at most: a wrong engine clock or value must not tell clients to stay away for days. */
export const RETRY_AFTER_CAP_S = 3600
/** The three forms of an HTTP-date (RFC 9110 5.6.7): IMF-fixdate, and the obsolete RFC 850 and asctime. */
const HTTP_DATE = [
  /^[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT$/,
  /^[A-Z][a-z]{5,8}, \d{2}-[A-Z][a-z]{2}-\d{2} \d{2}:\d{2}:\d{2} GMT$/,
  /^[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4}$/
]

/**
 * The engine's Retry-After as the gateway's whole delta-seconds (RFC 9110
 * 10.2.3): a number as it is, an HTTP-date as the seconds until it (at least
 * 1), both at most RETRY_AFTER_CAP_S; none or an unreadable one is 1.
 */
export function retryAfterSeconds (value: string | undefined, now = Date.now()): number {
  const text = value?.trim() ?? ''
  if (/^\d+$/.test(text)) return Math.min(Number(text), RETRY_AFTER_CAP_S)
  const form = HTTP_DATE.findIndex((pattern) => pattern.test(text))
  // asctime carries no zone: it is GMT all the same (RFC 9110 5.6.7).
  const at = form < 0 ? NaN : Date.parse(form === 2 ? `${text} GMT` : text)
  if (Number.isNaN(at)) return 1
  return Math.min(Math.max(1, Math.ceil((at - now) / 1000)), RETRY_AFTER_CAP_S)
}

/** Whether the engine's error is one the document declares: its status, and that status's code. */
function isDeclaredError (
  answer: EngineResponse, payload: unknown, errors: EngineErrors
): boolean {
  if (!isEngineError.Check(payload)) return false
  return errors.get(answer.status)?.has((payload as StructuredError).error.code) === true
}

/**
 * Throw unless the answer is the agreed 200 body (`isAgreed`) or the engine's
 * structured error with a status and code the document declares (`errors`, from
 * openapi-answers.ts declaredErrorCodes): anything else
 * is a 502. The engine's 503 (its store is away) and its 429 become the
 * gateway's simple 503, as every 503 is, with the engine's Retry-After.
 */
export function assertEngineJson (
  answer: EngineResponse, isAgreed: (value: unknown) => boolean, expected: string, errors: EngineErrors
): void {
  const payload = parseJson(answer)
  if (answer.status === 200 ? isAgreed(payload) : isDeclaredError(answer, payload, errors)) return
  // The engine asking to wait (its store away, or its own rate limit) is the gateway's one 503, with its wait.
  if ((answer.status === 503 && isEngineError.Check(payload)) || answer.status === 429) {
    const code = isEngineError.Check(payload) ? ` ${(payload as StructuredError).error.code}` : ''
    throw new GatewayError('UPSTREAM_RETRY_LATER', undefined, {
      headers: { 'retry-after': String(retryAfterSeconds(answer.retryAfter)) },
      cause: new Error(`engine answered ${answer.status}${code}, Retry-After ${answer.retryAfter ?? '(none)'}`)
    })
  }
  throw badResponse(answer, expected)
}

/** The ping answer is text: 200 `pong`, or the engine's structured error. */
export function sendEnginePong (reply: FastifyReply, answer: EngineResponse, errors: EngineErrors): FastifyReply {
  const pong = answer.status === 200 && answer.contentType.startsWith('text/plain')
  if (pong && answer.body.toString('latin1') === 'pong') {
    return reply.code(200).type('text/plain; charset=utf-8').send('pong')
  }
  assertEngineJson(answer, () => false, '200 text/plain pong', errors)
  return sendEngineJson(reply, answer)
}
