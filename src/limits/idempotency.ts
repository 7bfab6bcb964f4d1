/**
 * Idempotent create and update (DECISIONS 16, draft-ietf-httpapi-idempotency-key-header).
 *
 * A request with `Idempotency-Key` claims subject+key in the store before the
 * first byte goes to the engine. The engine's answer (its structured errors
 * included) is stored with the request's fingerprint; the gateway's own errors
 * release the claim, since a 502 or 504 leaves the outcome unknown. A later
 * request with the same key finds:
 *   a pending claim      -> 409 IDEMPOTENCY_KEY_IN_USE
 *   a different request  -> 422 IDEMPOTENCY_KEY_REUSED
 *   the same request     -> the stored status and body, byte for byte,
 *                           with `Idempotent-Replayed: true`
 * Store failures fail closed: 503 with Retry-After (DECISIONS 17).
 */
import { hash } from 'node:crypto'
import type { FastifyReply, FastifyRequest } from 'fastify'
import { GatewayError, validationError } from '../http/errors.js'
import type { EngineResponse } from '../engine-client/client.js'
import type { IdempotencyRecord, LimitStore } from './store.js'
import type { LimitsMetrics } from '../observability/metrics.js'

export const IDEMPOTENCY_HEADER = 'idempotency-key'
export const REPLAYED_HEADER = 'idempotent-replayed'

/** 1-255 visible ASCII characters (0x21-0x7E), bare or as a quoted string whose quotes are not part of the key. */
const BARE = /^[\x21-\x7e]{1,255}$/
const QUOTED = /^"([\x21\x23-\x7e]{1,255})"$/

/** The request's key, undefined without the header; a bad one is a 400 that names the header. */
export function idempotencyKeyOf (request: FastifyRequest): string | undefined {
  const raw = request.headers[IDEMPOTENCY_HEADER]
  if (raw === undefined) return undefined
  const value = Array.isArray(raw) ? undefined : raw
  const quoted = value === undefined ? null : QUOTED.exec(value)
  if (quoted !== null) return quoted[1]
  if (value !== undefined && BARE.test(value) && !value.startsWith('"')) return value
  throw validationError('Idempotency-Key header must be given once, as 1 to 255 visible ASCII characters, bare or in double quotes')
}

/** The fingerprint of a request: its route and its canonical validated content. */
export function fingerprintOf (route: string, canonical: string): string {
  // One-shot hash: half the cost of a Hash object on a string this short.
  return hash('sha256', `${route}\n${canonical}`, 'base64url')
}

export interface IdempotencyOptions {
  store: LimitStore
  ttlS: number
  /** How long an in-flight claim holds if its instance dies mid-request. */
  pendingTtlMs: number
  metrics: LimitsMetrics
}

/** A claimed key: the route finishes it with `complete` (engine answered) or `release` (gateway error). */
export interface Claim {
  complete: (fingerprint: string, answer: EngineResponse) => Promise<void>
  release: () => Promise<void>
}

export type Begin = { claim: Claim } | { held: IdempotencyRecord }

export class Idempotency {
  readonly #opts: IdempotencyOptions

  constructor (opts: IdempotencyOptions) {
    this.#opts = opts
  }

  /** Claim subject+key, or say who holds it. */
  async begin (request: FastifyRequest, key: string): Promise<Begin> {
    const { store, ttlS, pendingTtlMs } = this.#opts
    const storeKey = `${request.userId.length}:${request.userId}:${key}`
    let held
    try {
      held = await store.claim(storeKey, pendingTtlMs)
    } catch (err) {
      this.#opts.metrics.idempotencyShortCut('store_unavailable')
      throw storeUnavailable(request, err)
    }
    if (held !== undefined) return { held }
    return {
      claim: {
        complete: async (fingerprint, answer) => {
          const record: IdempotencyRecord = { state: 'done', fingerprint, status: answer.status, contentType: answer.contentType, body: answer.body.toString('base64') }
          try {
            await store.complete(storeKey, record, ttlS * 1000)
          } catch (err) {
            // The engine has answered; the client gets it. A retry meets the
            // pending claim (409) until it expires, and the engine deduplicates.
            request.log.warn({ err: { message: (err as Error).message } }, 'idempotency record not stored')
          }
        },
        release: async () => {
          try {
            await store.release(storeKey)
          } catch (err) {
            request.log.warn({ err: { message: (err as Error).message } }, 'idempotency claim not released')
          }
        }
      }
    }
  }

  /** Answer a request whose key is held by another: 409, 422 or the replay. */
  answerHeld (reply: FastifyReply, held: IdempotencyRecord, fingerprint: string): FastifyReply {
    const { metrics } = this.#opts
    if (held.state === 'pending') {
      metrics.idempotencyShortCut('in_flight')
      throw new GatewayError('IDEMPOTENCY_KEY_IN_USE')
    }
    if (held.fingerprint !== fingerprint) {
      metrics.idempotencyShortCut('conflict')
      throw new GatewayError('IDEMPOTENCY_KEY_REUSED')
    }
    metrics.idempotencyShortCut('replay')
    return reply.code(held.status).header(REPLAYED_HEADER, 'true').type(held.contentType).send(Buffer.from(held.body, 'base64'))
  }
}

function storeUnavailable (request: FastifyRequest, err: unknown): GatewayError {
  request.log.warn({ err: { message: (err as Error).message } }, 'idempotency store unavailable: request refused')
  return new GatewayError('IDEMPOTENCY_STORE_UNAVAILABLE', undefined, { headers: { 'retry-after': '1' }, cause: err })
}
