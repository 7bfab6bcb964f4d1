/**
 * One engine call across the cluster: pick an endpoint, try, and on a failure the retry policy allows, try another
 * (decision: several engine endpoints). One object per call and one per try, so a call allocates no closures beyond its
 * promise.
 */
import type { Dispatcher } from 'undici'
import { REQUEST_ID_HEADER, USER_ID_HEADER } from '../../schemas/upstream.js'
import { GatewayError, upstreamError } from '../http/errors.js'
import type { EngineCallName, EngineOutcome } from '../observability/metrics.js'
import { Attempt, HOLD_DEADLINES, isTimeout, kQueuedAbort, type AttemptOwner } from './attempt.js'
import type { Balancer, Random } from './balancer.js'
import type { Endpoint, EndpointSet } from './endpoints.js'
import type { HealthState } from './health.js'
import { isGatewayFailure, jitterMs, MAX_RETRIES, retryReason, type RetryBudget, type RetryReason } from './retry.js'
import type { ClusterObserver, EngineCallObserver, EngineRequest, EngineResponse, EngineTryObserver } from './types.js'

/** What every call shares: made once by the EngineClient. */
export interface ClusterContext {
  set: EndpointSet
  health: HealthState
  balancer: Balancer
  budget: RetryBudget
  random: Random
  timeoutMs: number
  tryTimeoutMs: number
  maxResponseBytes: number
  observer: EngineCallObserver | undefined
  cluster: ClusterObserver | undefined
  /** The tracer's per-try observer; undefined costs nothing. */
  tries: EngineTryObserver | undefined
  /** A dispatcher with a connection of its own: a single endpoint's retry goes on a fresh connection
   * (decision: several engine endpoints).
   */
  fresh: (origin: string) => Dispatcher
  /** Requests waiting in a pool's own queue (undici's counter). */
  queued: (pool: Endpoint['pool']) => number
}

/** The metrics label of each engine path: a fixed set, never the path itself. */
const CALL_NAMES: Readonly<Record<string, EngineCallName>> = {
  '/api/portfolio/ping': 'ping',
  '/api/portfolio/create': 'create',
  '/api/portfolio/update': 'update',
  '/health': 'health'
}

/** The endpoint label of a call that found no endpoint to try. */
export const NO_ENDPOINT = 'none'

/** What a finished call means (decision: what the client gets when the engine fails), by status and type alone:
 * answers.ts judges the body.
 */
function outcomeOf (
  err: GatewayError | undefined,
  status: number,
  contentType: string,
  clientAborted: boolean
): EngineOutcome {
  if (clientAborted) return 'client_aborted'
  if (err === undefined) {
    if (status >= 200 && status < 300) return 'ok'
    return status >= 400 && contentType.startsWith('application/json') ? 'engine_error' : 'bad_response'
  }
  if (err.code === 'UPSTREAM_TIMEOUT') return 'timeout'
  if (err.code === 'UPSTREAM_BAD_RESPONSE') return 'bad_response'
  return 'unavailable'
}

/** An abort reason as the call's error: AbortSignal.timeout's TimeoutError is the engine taking too long. */
export function abortError (reason: unknown): Error {
  if (reason instanceof Error && reason.name === 'TimeoutError' && !(reason instanceof GatewayError)) {
    return new GatewayError('UPSTREAM_TIMEOUT', undefined, { cause: reason })
  }
  return reason as Error
}

function attemptTimer (call: Call, attempt: Attempt, lastChance: boolean): void {
  call.attemptTimedOut(attempt, lastChance)
}

function jitterDone (call: Call): void {
  call.afterJitter()
}

export class Call implements AttemptOwner {
  readonly name: EngineCallName
  readonly #headers: Record<string, string>
  readonly #startedAt: number
  /** performance.now() by which the engine's headers must be in; 0: no deadline (uploads keep their own clock). */
  readonly #deadlineAt: number
  readonly #deadlineMs: number
  /** A GET with somewhere else to go: each try has its own, shorter clock. */
  readonly #perTry: boolean
  #retries = 0
  /** Why the next try is a retry (the tracer's retryReason). */
  #reason: RetryReason | undefined = undefined
  #tried: Endpoint[] | undefined = undefined
  #attempt: Attempt | undefined = undefined
  /** A retry of this call holds the budget, from its grant to the end of its try. */
  #retrying = false
  #stopped: Error | undefined = undefined
  #jitter: NodeJS.Timeout | undefined = undefined
  #lastError: GatewayError | undefined = undefined
  #lastAttempt: Attempt | undefined = undefined
  #settled = false

  constructor (
    readonly ctx: ClusterContext,
    readonly req: EngineRequest,
    readonly resolve: (answer: EngineResponse) => void,
    readonly reject: (err: GatewayError) => void
  ) {
    this.name = CALL_NAMES[req.path] ?? 'other'
    const headers: Record<string, string> = { [REQUEST_ID_HEADER]: req.requestId }
    if (req.userId !== undefined) headers[USER_ID_HEADER] = req.userId
    if (req.contentType !== undefined) headers['content-type'] = req.contentType
    if (req.idempotencyKey !== undefined) headers['idempotency-key'] = req.idempotencyKey
    if (typeof req.body === 'string') headers['content-length'] = String(Buffer.byteLength(req.body))
    if (req.traceparent !== undefined) headers.traceparent = req.traceparent
    this.#headers = headers
    this.#startedAt = performance.now()
    // The deadline counts from the moment the gateway asks, queue included
    // (decision: what the client gets when the engine fails). undici's own headersTimeout starts only on a socket and
    // fires on a ~1 s grid.
    const deadlineMs = req.responseTimeoutMs ?? ctx.timeoutMs
    this.#deadlineMs = deadlineMs
    this.#deadlineAt = deadlineMs > 0 ? this.#startedAt + deadlineMs : 0
    this.#perTry = req.method === 'GET' && deadlineMs > ctx.tryTimeoutMs && ctx.set.list.length > 1
    // The call itself listens (handleEvent): a closure here made V8 pretenure every call's objects.
    req.signal?.addEventListener('abort', this, { once: true })
    req.abandonIfQueued?.addEventListener('abort', this, { once: true })
  }

  /** `signal` aborted (stop the call), or the client went away (`abandonIfQueued`: leave the queue). */
  handleEvent (): void {
    const { signal, abandonIfQueued: leave } = this.req
    if (signal?.aborted === true) this.#stop(abortError(signal.reason))
    else if (leave?.aborted === true) this.#leave(abortError(leave.reason))
  }

  /** The client went away (abandonIfQueued): stop, unless a try is already being written to the engine. */
  #leave (err: Error): void {
    if (this.#attempt !== undefined && this.#attempt.sent && this.#jitter === undefined) return
    this.#stop(err)
  }

  start (): void {
    this.ctx.budget.calls++
    const leave = this.req.abandonIfQueued
    if (leave?.aborted === true) {
      this.#finish(upstreamError(abortError(leave.reason)), undefined, true)
      return
    }
    const endpoint = this.ctx.balancer.pick(this.ctx.set.list, undefined)
    // Every endpoint is known unreachable: 502 now, not after a connect failure or timeout
    // (decision: several engine endpoints).
    if (endpoint === undefined) this.#finish(new GatewayError('UPSTREAM_UNAVAILABLE'), undefined, false)
    else this.#dispatch(endpoint)
  }

  /** The client went away, or the call's own deadline passed: no further try. */
  #stop (err: Error): void {
    this.#stopped ??= err
    if (this.#jitter !== undefined) {
      clearTimeout(this.#jitter)
      this.#jitter = undefined
      this.#finish(upstreamError(this.#stopped), undefined, !isTimeout(this.#stopped))
    } else {
      this.#attempt?.giveUp(this.#stopped)
    }
  }

  /** `fresh`: on a connection of its own, not the pool's (a single endpoint's retry). */
  #dispatch (endpoint: Endpoint, fresh = false): void {
    const { ctx, req } = this
    const attempt = new Attempt(this, endpoint, ctx.maxResponseBytes)
    this.#attempt = attempt
    endpoint.inFlight++
    let headers = endpoint.hostHeader === undefined ? this.#headers : { ...this.#headers, host: endpoint.hostHeader }
    const tries = ctx.tries
    if (tries !== undefined) {
      const span = tries.startTry({
        call: this.name,
        request: req,
        endpoint: endpoint.key,
        attempt: this.#retries + 1,
        retryReason: this.#reason
      })
      attempt.span = span
      if (span?.traceparent !== undefined) headers = { ...headers, traceparent: span.traceparent }
    }
    if (this.#deadlineAt !== 0) {
      // A first try's clock is the whole deadline, as a whole number: calls asked in the same
      // millisecond share one timer list and time out together (test/engine-client/timeout.test.ts).
      const remaining = this.#tried === undefined ? this.#deadlineMs : this.#deadlineAt - performance.now()
      const lastChance = !this.#perTry || remaining <= ctx.tryTimeoutMs
      attempt.timer = setTimeout(
        attemptTimer,
        Math.max(1, lastChance ? remaining : ctx.tryTimeoutMs),
        this,
        attempt,
        lastChance
      )
    }
    // undici documents AsyncIterable bodies for dispatch; its typings omit them.
    const body = attempt.bodyOf(req.body) as Dispatcher.DispatchOptions['body']
    // Only a GET (which has no body) is held: an update or a create given up must reach the engine as a closed
    // connection, so an engine that cancels on disconnect never applies it after its client was told 504.
    const hold = this.#deadlineAt !== 0 && req.method === 'GET'
    const options: Dispatcher.DispatchOptions = {
      method: req.method,
      path: req.path,
      headers,
      body,
      // A held try's socket lives this long past its send unless the engine answers: the most a slow engine waits
      // before the gateway sends it a fresh connection in its place.
      headersTimeout: hold ? HOLD_DEADLINES * this.#deadlineMs : (req.headersTimeoutMs ?? ctx.timeoutMs),
      [kQueuedAbort]: attempt.queued
    }
    attempt.holdable = hold
    // A pool closed with the client fails the retry as it failed the try: no new socket after close().
    if (fresh && !endpoint.pool.closed && !endpoint.pool.destroyed) {
      const own = (attempt.own = ctx.fresh(endpoint.origin))
      own.dispatch(options, attempt)
      return
    }
    const pool = endpoint.pool
    const queuedBefore = ctx.queued(pool)
    pool.dispatch(options, attempt)
    // Into the pool's own queue (every connection busy): if given up there, it must stop counting at once.
    attempt.poolQueued = ctx.queued(pool) > queuedBefore
  }

  tooLate (attempt: Attempt): boolean {
    if (this.#deadlineAt === 0 || performance.now() < this.#deadlineAt) return false
    this.attemptTimedOut(attempt, true)
    return true
  }

  attemptTimedOut (attempt: Attempt, lastChance: boolean): void {
    if (attempt !== this.#attempt) return
    if (lastChance) this.#stopped ??= new GatewayError('UPSTREAM_TIMEOUT')
    else attempt.tryTimedOut = true
    attempt.giveUp(this.#stopped ?? new GatewayError('UPSTREAM_TIMEOUT'))
  }

  attemptResponded (): void {
    this.req.onResponseStart?.()
  }

  attemptEnded (attempt: Attempt, raw: Error | undefined): void {
    const { ctx, req } = this
    const endpoint = attempt.endpoint
    endpoint.inFlight--
    if (this.#retrying) {
      this.#retrying = false
      ctx.budget.retries--
    }
    const err = raw === undefined ? undefined : upstreamError(raw)
    const stopped = this.#stopped
    // A refused form, a client gone or too slow says nothing about the endpoint; a deadline does
    // (decision: uploads share the engine fairly).
    const clientAborted = attempt.bodyFailed || (stopped !== undefined && !isTimeout(stopped))
    if (!clientAborted) {
      if (isGatewayFailure(err, req.path, attempt.status, attempt.contentType)) ctx.health.failed(endpoint)
      else ctx.health.succeeded(endpoint)
    }
    attempt.span?.end(
      outcomeOf(err, attempt.status, attempt.contentType, clientAborted),
      attempt.status === 0 ? undefined : attempt.status
    )
    // A client gone while this try was being written takes no retry (abandonIfQueued).
    if (stopped === undefined && !clientAborted && req.abandonIfQueued?.aborted !== true) {
      const reason = retryReason(
        req.method,
        attempt.sent,
        err,
        attempt.tryTimedOut,
        req.path,
        attempt.status,
        attempt.contentType
      )
      if (reason !== undefined && this.#retry(reason, endpoint, err, attempt)) return
    }
    this.#finish(err, attempt, clientAborted)
  }

  /** Try again if the policy, the endpoints left, the deadline and the budget allow it. */
  #retry (reason: RetryReason, failed: Endpoint, err: GatewayError | undefined, attempt: Attempt): boolean {
    const { ctx } = this
    const list = ctx.set.list
    const single = list.length === 1
    // A single endpoint gets one retry, on a fresh connection: when the call never reached it, or a GET met a reset (a
    // stale keep-alive socket).
    const spent = single
      ? this.#retries >= 1 || (reason !== 'unreachable' && reason !== 'reset')
      : this.#retries >= MAX_RETRIES
    if (spent) return false
    if (this.#deadlineAt !== 0 && performance.now() >= this.#deadlineAt) return false
    const tried = (this.#tried ??= [])
    tried.push(failed)
    if (!single && ctx.balancer.pick(list, tried) === undefined) return false
    // A try that could not connect put no load on any engine: the budget, there to spare engines a storm, allows it.
    if (reason !== 'unreachable' && !ctx.budget.allows()) {
      ctx.cluster?.budgetExhausted?.()
      return false
    }
    this.#retries++
    this.#reason = reason
    this.#retrying = true
    ctx.budget.retries++
    ctx.cluster?.retried?.(this.name, reason)
    this.#lastError = err
    this.#lastAttempt = attempt
    if (this.#retries === 1) this.afterJitter()
    else this.#jitter = setTimeout(jitterDone, jitterMs(ctx.random), this)
    return true
  }

  afterJitter (): void {
    this.#jitter = undefined
    const list = this.ctx.set.list
    const next = list.length === 1 ? list[0] : this.ctx.balancer.pick(list, this.#tried)
    if (next === undefined || (this.#deadlineAt !== 0 && performance.now() >= this.#deadlineAt)) {
      this.#retrying = false
      this.ctx.budget.retries--
      // Nobody left after the wait: the last try's failure or answer (a GET's 503 passes on as it came).
      if (next === undefined) this.#finish(this.#lastError, this.#lastAttempt, false)
      else this.#finish(new GatewayError('UPSTREAM_TIMEOUT'), this.#lastAttempt, false)
      return
    }
    this.#dispatch(next, list.length === 1)
  }

  #finish (err: GatewayError | undefined, attempt: Attempt | undefined, clientAborted: boolean): void {
    if (this.#settled) return
    this.#settled = true
    const { ctx, req } = this
    ctx.budget.calls--
    if (this.#retrying) {
      this.#retrying = false
      ctx.budget.retries--
    }
    req.signal?.removeEventListener('abort', this)
    req.abandonIfQueued?.removeEventListener('abort', this)
    const status = attempt?.status ?? 0
    const contentType = attempt?.contentType ?? ''
    ctx.observer?.(
      this.name,
      outcomeOf(err, status, contentType, clientAborted),
      (performance.now() - this.#startedAt) / 1000,
      attempt?.endpoint.key ?? NO_ENDPOINT
    )
    if (err !== undefined) this.reject(err)
    else {
      const { retryAfter } = attempt!
      this.resolve({ status, contentType, body: attempt!.body(), ...(retryAfter === undefined ? {} : { retryAfter }) })
    }
  }
}
