/**
 * Reading the engine's answers against the upstream contract (DECISIONS 8):
 * the agreed 2xx body goes to the client as the engine sent it, the engine's
 * own structured errors pass through unchanged, and anything else is a 502.
 */
import type { FastifyReply } from 'fastify'
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

/** Throw the 502 unless the answer is the agreed 200 body (`isAgreed`) or the engine's structured error. */
export function assertEngineJson (answer: EngineResponse, isAgreed: (value: unknown) => boolean, expected: string): void {
  const payload = parseJson(answer)
  const ok = answer.status === 200 ? isAgreed(payload) : answer.status >= 400 && isEngineError.Check(payload)
  if (!ok) throw badResponse(answer, expected)
}

/** The ping answer is text: 200 `pong`, or the engine's structured error. */
export function sendEnginePong (reply: FastifyReply, answer: EngineResponse): FastifyReply {
  if (answer.status === 200 && answer.contentType.startsWith('text/plain') && answer.body.toString('latin1') === 'pong') {
    return reply.code(200).type('text/plain; charset=utf-8').send('pong')
  }
  assertEngineJson(answer, () => false, '200 text/plain pong')
  return sendEngineJson(reply, answer)
}
