/**
 * A client gone before its answer was sent: the response closed unfinished (a request's own 'close' fires as
 * soon as its body is read). Not an AbortSignal, whose EventTarget cost a ping a quarter of its CPU
 * (docs/performance-history.md); one 'close' listener shared by every response serves both the engine call's
 * signal and the access line, with no closure per request.
 */
import type { ServerResponse } from 'node:http'
import type { FastifyReply } from 'fastify'
import { validationError } from './errors.js'

export type AbandonmentListener = (() => void) | { handleEvent: () => void }

/** An AbortSignal fits it too. */
export interface Abandonment {
  readonly aborted: boolean
  readonly reason: unknown
  addEventListener: (type: 'abort', listener: AbandonmentListener, options?: { once?: boolean }) => void
  removeEventListener: (type: 'abort', listener: AbandonmentListener) => void
}

export interface ClientGone {
  readonly signal: Abandonment
  done: () => void
}

/**
 * Told once when a watched response closes before its line was written: unfinished, the client left; finished,
 * Fastify never reported the answer; with `cutStatus`, the server itself ended the request.
 */
export type ResponseClosed = (reply: FastifyReply, finished: boolean, cutStatus: number | undefined) => void

const WATCH = Symbol('client-gone watch')

class Watch {
  /** The engine call's signal while a handler watches; only the latest watch is told. */
  gone: Gone | undefined = undefined
  closed: ResponseClosed | undefined
  /** `closed` was told: the line is written, nothing else may write one. */
  told = false
  cutStatus: number | undefined = undefined

  constructor (readonly reply: FastifyReply, closed: ResponseClosed | undefined) {
    this.closed = closed
  }
}

type Watched = ServerResponse & { [WATCH]?: Watch }

class Gone implements Abandonment, ClientGone {
  aborted = false
  reason: unknown = undefined
  #listener: AbandonmentListener | undefined = undefined
  readonly #watch: Watch

  constructor (watch: Watch) {
    this.#watch = watch
  }

  get signal (): Abandonment { return this }
  done (): void { if (this.#watch.gone === this) this.#watch.gone = undefined }

  addEventListener (_type: 'abort', listener: AbandonmentListener): void { this.#listener = listener }
  removeEventListener (_type: 'abort', listener: AbandonmentListener): void {
    if (this.#listener === listener) this.#listener = undefined
  }

  abort (reason: unknown): void {
    if (this.aborted) return
    this.aborted = true
    this.reason = reason
    const listener = this.#listener
    this.#listener = undefined
    if (typeof listener === 'function') listener()
    else listener?.handleEvent()
  }
}

const wentAway = (): Error => validationError('the client went away before its answer was sent')

function onResponseClose (this: Watched): void {
  const watch = this[WATCH]
  if (watch === undefined) return
  const finished = this.writableFinished
  if (!finished) {
    const gone = watch.gone
    watch.gone = undefined
    gone?.abort(wentAway())
  }
  const closed = watch.closed
  if (closed === undefined) return
  watch.closed = undefined
  watch.told = true
  closed(watch.reply, finished, watch.cutStatus)
}

function watchOf (reply: FastifyReply, closed: ResponseClosed | undefined): Watch {
  const res = reply.raw as Watched
  let watch = res[WATCH]
  if (watch === undefined) {
    watch = res[WATCH] = new Watch(reply, closed)
    res.on('close', onResponseClose)
  } else if (closed !== undefined && !watch.told) {
    watch.closed = closed
  }
  return watch
}

/** Tell `closed` once if `reply`'s response closes before `answered(reply)` was called. */
export function watchResponse (reply: FastifyReply, closed: ResponseClosed): void {
  watchOf(reply, closed)
}

/** The response's line is being written now; false when a close already wrote it. */
export function answered (reply: FastifyReply): boolean {
  const watch = (reply.raw as Watched)[WATCH]
  if (watch === undefined) return true
  if (watch.told) return false
  watch.closed = undefined
  watch.told = true
  return true
}

/**
 * The server, not the client, ends this request (its idle timeout, or a raw answer to a parser error), so the line
 * shows `status` as nginx logs its own, not a client that left. Returns the id for the raw answer to carry.
 */
export function cutByServer (res: ServerResponse, status: number | undefined): string | undefined {
  const watch = (res as Watched)[WATCH]
  if (watch === undefined) return undefined
  // undefined: not cut by the server after all (the client had reset the connection).
  watch.cutStatus = status
  return watch.reply.request.id
}

/** Watch for the client going away while a handler waits; `done()` when the answer is being sent. */
export function watchClientGone (reply: FastifyReply): ClientGone {
  const watch = watchOf(reply, undefined)
  const gone = new Gone(watch)
  const res = reply.raw
  if (res.destroyed || res.socket?.destroyed === true) {
    if (!res.writableFinished) gone.abort(wentAway())
  } else {
    watch.gone = gone
  }
  return gone
}
