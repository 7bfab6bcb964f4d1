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
import type { FastifyReply, FastifyRequest } from 'fastify'
import { GatewayError, validationError } from '../http/errors.js'
import type { EngineResponse } from '../engine-client/client.js'
import { sendEngineJson } from '../engine-client/answers.js'
import { ownerToken, type IdempotencyRecord, type LimitStore } from './store.js'
import type { LimitsMetrics } from '../observability/metrics.js'
import { endStoreSpan, startStoreSpan } from '../observability/tracing.js'
import { randomHex } from '../shared/random-hex.js'

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
  throw validationError(
    'Idempotency-Key header must be given once, as 1 to 255 visible ASCII characters, bare or in double quotes'
  )
}

/** Shared with the reference engine, which fingerprints its creates alike. */
export { fingerprintOf } from '../shared/fingerprint.js'

export interface IdempotencyOptions {
  store: LimitStore
  ttlS: number
  /**
   * How long an in-flight claim holds if its instance dies mid-request: longer
   * than the longest request the server allows (limits.ts), whatever ttlS is.
   */
  pendingTtlMs: number
  metrics: LimitsMetrics
}

/** A claimed key: finished with `complete` (engine answered) or `release` (gateway error). */
interface Claim {
  complete: (fingerprint: string, answer: EngineResponse) => Promise<void>
  release: () => Promise<void>
}

/** What a route hands `Idempotency.run`: its engine call and how to fingerprint its request. */
export interface IdempotentCall {
  /** The engine call, its answer checked: the answer it resolves with is the one stored. */
  call: () => Promise<EngineResponse>
  /** The request's fingerprint (fingerprintOf), once its content has been read. */
  fingerprint: () => string
  /** Read and check the rest of the request without sending it, when a completed record is found. */
  readAll?: () => Promise<void>
  /** How long this request may still run once it holds the key: a 409 tells a second one to wait that long. */
  runsForMs: number
}

export class Idempotency {
  readonly #opts: IdempotencyOptions

  constructor (opts: IdempotencyOptions) {
    this.#opts = opts
  }

  /**
   * A route's engine call under its Idempotency-Key, if it has one. With a
   * key: claimed before the engine is asked; a key held by another request is
   * answered from its record (409, 422, or the replay: the reply is sent and
   * undefined returned); otherwise the call, and the record stored before the
   * answer goes out, or the claim released when the call failed.
   */
  async run (
    request: FastifyRequest,
    reply: FastifyReply,
    key: string | undefined,
    route: IdempotentCall
  ): Promise<EngineResponse | undefined> {
    if (key === undefined) return await route.call()
    const begun = await this.#begin(request, key, route.runsForMs)
    if ('held' in begun) {
      const { held } = begun
      if (held.state === 'pending') {
        this.#opts.metrics.idempotencyShortCut('in_flight')
        const headers = { 'retry-after': String(retryAfterS(held.until)) }
        throw new GatewayError('IDEMPOTENCY_KEY_IN_USE', undefined, { headers })
      }
      // A completed record: the request is read whole and checked, never forwarded.
      await route.readAll?.()
      this.#replay(reply, held, route.fingerprint())
      return undefined
    }
    try {
      const answer = await route.call()
      // An engine 503 means "not done, retry later" (its store is down, it is
      // draining): stored, it would be replayed for IDEMPOTENCY_TTL_S to a
      // client told to retry. It goes out; the key is free for the retry.
      if (answer.status === 503) await begun.claim.release()
      else await begun.claim.complete(route.fingerprint(), answer)
      return answer
    } catch (err) {
      await begun.claim.release()
      throw err
    }
  }

  /** Claim subject+key under a fresh owner token, or say who holds it. */
  async #begin (
    request: FastifyRequest,
    key: string,
    runsForMs: number
  ): Promise<{ claim: Claim } | { held: IdempotencyRecord }> {
    const { store, ttlS, pendingTtlMs } = this.#opts
    const subject = request.userId
    // Only this request knows its token: complete and release act only while
    // the record is still this claim (a late one never touches a newer claim's record).
    // The token begins with the time this request may run until, for the 409's Retry-After.
    const owner = ownerToken(Date.now() + Math.min(runsForMs, pendingTtlMs), randomHex(16))
    let held
    const claimSpan = startStoreSpan(request, 'claim')
    try {
      held = await store.claim(subject, key, owner, pendingTtlMs)
      endStoreSpan(claimSpan)
    } catch (err) {
      endStoreSpan(claimSpan, err)
      this.#opts.metrics.idempotencyShortCut('store_unavailable')
      throw storeUnavailable(request, err)
    }
    if (held !== undefined) return { held }
    return {
      claim: {
        complete: async (fingerprint, answer) => {
          const record: IdempotencyRecord = {
            state: 'done',
            fingerprint,
            status: answer.status,
            contentType: answer.contentType,
            body: answer.body.toString('base64')
          }
          // The store's write and, with replicas, its WAIT for one (DECISIONS 26).
          const span = startStoreSpan(request, 'complete')
          try {
            const stored = await store.complete(subject, key, owner, record, ttlS * 1000)
            endStoreSpan(span)
            if (!stored) {
              // The claim expired or was evicted, and maybe another request holds the key now: its record stays.
              request.log.warn('idempotency record not stored: the claim was no longer held')
            }
          } catch (err) {
            endStoreSpan(span, err)
            // The engine has answered; the client gets it. A retry meets the
            // pending claim (409) until it expires, and the engine deduplicates.
            request.log.warn({ err: { message: (err as Error).message } }, 'idempotency record not stored')
          }
        },
        release: async () => {
          const span = startStoreSpan(request, 'release')
          try {
            await store.release(subject, key, owner)
            endStoreSpan(span)
          } catch (err) {
            endStoreSpan(span, err)
            request.log.warn({ err: { message: (err as Error).message } }, 'idempotency claim not released')
          }
        }
      }
    }
  }

  /** A completed record: the stored answer for the same request, 422 for another. */
  #replay (reply: FastifyReply, held: Extract<IdempotencyRecord, { state: 'done' }>, fingerprint: string): void {
    const { metrics } = this.#opts
    if (held.fingerprint !== fingerprint) {
      metrics.idempotencyShortCut('conflict')
      throw new GatewayError('IDEMPOTENCY_KEY_REUSED')
    }
    metrics.idempotencyShortCut('replay')
    // Through the function that sent the first answer, so the replay's
    // content-type is the first answer's, byte for byte (not the engine's as
    // stored, which may differ in case or charset).
    sendEngineJson(reply.header(REPLAYED_HEADER, 'true'), {
      status: held.status,
      contentType: held.contentType,
      body: Buffer.from(held.body, 'base64')
    })
  }
}

/** Whole seconds until the request holding the key must be done, at least 1 (a claim with no time: 1). */
export function retryAfterS (until: number | undefined, now = Date.now()): number {
  return until === undefined ? 1 : Math.max(1, Math.ceil((until - now) / 1000))
}

function storeUnavailable (request: FastifyRequest, err: unknown): GatewayError {
  request.log.warn({ err: { message: (err as Error).message } }, 'idempotency store unavailable: request refused')
  return new GatewayError('IDEMPOTENCY_STORE_UNAVAILABLE', undefined, { headers: { 'retry-after': '1' }, cause: err })
}
