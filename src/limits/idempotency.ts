/**
 * Idempotent create and update, as draft-ietf-httpapi-idempotency-key-header has it (decision: idempotency). The
 * engine's answer is stored; the gateway's own errors release the claim, since a 502 or 504 leaves the outcome
 * unknown. Store failures fail closed (decision: shared state).
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

/** A quoted key's quotes are not part of the key. */
const BARE = /^[\x21-\x7e]{1,255}$/
const QUOTED = /^"([\x21\x23-\x7e]{1,255})"$/

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
  /** See pendingTtlMs in limits.ts. */
  pendingTtlMs: number
  metrics: LimitsMetrics
}

/** A key this request claimed, under its owner token. */
interface Held { subject: string, key: string, owner: string }

interface Claim {
  complete: (fingerprint: string, answer: EngineResponse) => Promise<void>
  release: () => Promise<void>
}

export interface IdempotentCall {
  /** The answer it resolves with is the one stored. */
  call: () => Promise<EngineResponse>
  /** Called once the request's content has been read. */
  fingerprint: () => string
  /** Reads and checks the rest of a request that is replayed, never forwarded. */
  readAll?: () => Promise<void>
  /** A 409 tells a second request to wait this long. */
  runsForMs: number
}

export class Idempotency {
  readonly #opts: IdempotencyOptions

  constructor (opts: IdempotencyOptions) {
    this.#opts = opts
  }

  /** Undefined when the answer was a replay, already sent. */
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
      await route.readAll?.()
      this.#replay(reply, held, route.fingerprint())
      return undefined
    }
    try {
      const answer = await route.call()
      // An engine 503 means "retry later": stored, it would be replayed to the retry.
      if (answer.status === 503) await begun.claim.release()
      else await begun.claim.complete(route.fingerprint(), answer)
      return answer
    } catch (err) {
      await begun.claim.release()
      throw err
    }
  }

  async #begin (
    request: FastifyRequest,
    key: string,
    runsForMs: number
  ): Promise<{ claim: Claim } | { held: IdempotencyRecord }> {
    const { store, pendingTtlMs } = this.#opts
    const subject = request.userId
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
    const mine: Held = { subject, key, owner }
    return {
      claim: {
        complete: async (fingerprint, answer) => { await this.#complete(request, mine, fingerprint, answer) },
        release: async () => { await this.#release(request, mine) }
      }
    }
  }

  async #complete (request: FastifyRequest, held: Held, fingerprint: string, answer: EngineResponse): Promise<void> {
    const { store, ttlS } = this.#opts
    const record: IdempotencyRecord = {
      state: 'done',
      fingerprint,
      status: answer.status,
      contentType: answer.contentType,
      body: answer.body.toString('base64')
    }
    const span = startStoreSpan(request, 'complete')
    try {
      const stored = await store.complete(held.subject, held.key, held.owner, record, ttlS * 1000)
      endStoreSpan(span)
      if (!stored) {
        // Another request may hold the key now: its record stays.
        request.log.warn('idempotency record not stored: the claim was no longer held')
      }
    } catch (err) {
      endStoreSpan(span, err)
      // The client still gets the engine's answer; a retry meets the pending claim (409) until it expires.
      request.log.warn({ err: { message: (err as Error).message } }, 'idempotency record not stored')
    }
  }

  async #release (request: FastifyRequest, { subject, key, owner }: Held): Promise<void> {
    const span = startStoreSpan(request, 'release')
    try {
      await this.#opts.store.release(subject, key, owner)
      endStoreSpan(span)
    } catch (err) {
      endStoreSpan(span, err)
      request.log.warn({ err: { message: (err as Error).message } }, 'idempotency claim not released')
    }
  }

  #replay (reply: FastifyReply, held: Extract<IdempotencyRecord, { state: 'done' }>, fingerprint: string): void {
    const { metrics } = this.#opts
    if (held.fingerprint !== fingerprint) {
      metrics.idempotencyShortCut('conflict')
      throw new GatewayError('IDEMPOTENCY_KEY_REUSED')
    }
    metrics.idempotencyShortCut('replay')
    // Through the function that sent the first answer, so the replay's content-type matches it byte for byte.
    sendEngineJson(reply.header(REPLAYED_HEADER, 'true'), {
      status: held.status,
      contentType: held.contentType,
      body: Buffer.from(held.body, 'base64')
    })
  }
}

export function retryAfterS (until: number | undefined, now = Date.now()): number {
  return until === undefined ? 1 : Math.max(1, Math.ceil((until - now) / 1000))
}

function storeUnavailable (request: FastifyRequest, err: unknown): GatewayError {
  request.log.warn({ err: { message: (err as Error).message } }, 'idempotency store unavailable: request refused')
  return new GatewayError('IDEMPOTENCY_STORE_UNAVAILABLE', undefined, { headers: { 'retry-after': '1' }, cause: err })
}
