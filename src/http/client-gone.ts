/**
 * A signal that a client went away before its answer was sent: the
 * connection closed while the response was unfinished. An IncomingMessage's
 * own 'close' is no use for this: it fires as soon as a body is read whole.
 *
 * Not an AbortSignal: every ping and update carries one, and an AbortController
 * with its EventTarget listener cost a ping about a quarter of its CPU in the
 * bench. This is the part of an AbortSignal the engine client uses, one listener.
 *
 * A response is watched by one 'close' listener, the same function for every
 * response (no closure per request: see docs/performance.md on pretenuring),
 * which finds its request's state on the response. Two things share it: the
 * engine call's signal while a handler waits on the engine (watchClientGone),
 * and the access line, which is told when a response closes without its line
 * (watchResponse): a client that left, or an answer Fastify never reports.
 */
import type { ServerResponse } from 'node:http'
import type { FastifyReply } from 'fastify'
import { validationError } from './errors.js'

/** An 'abort' listener: a function, or an object with handleEvent (as the DOM's EventTarget takes). */
export type AbandonmentListener = (() => void) | { handleEvent: () => void }

/** Told once when the client is gone (an AbortSignal fits it too). */
export interface Abandonment {
  readonly aborted: boolean
  readonly reason: unknown
  addEventListener: (type: 'abort', listener: AbandonmentListener, options?: { once?: boolean }) => void
  removeEventListener: (type: 'abort', listener: AbandonmentListener) => void
}

export interface ClientGone {
  readonly signal: Abandonment
  /** Stop watching (the answer is being sent or the handler is done). */
  done: () => void
}

/**
 * Told once when a watched response closes before its line was written:
 * `finished` false is a client that left before the answer finished; true,
 * an answer that went out without the framework reporting it. `cutStatus`:
 * the server itself ended the request (its own timeout, or a raw answer to a
 * parser error), with this status, so the client did not leave.
 */
export type ResponseClosed = (reply: FastifyReply, finished: boolean, cutStatus: number | undefined) => void

const WATCH = Symbol('client-gone watch')

/** One request's state, kept on its response for the shared 'close' listener. */
class Watch {
  /** The engine call's signal while a handler watches; only the latest watch is told. */
  gone: Gone | undefined = undefined
  closed: ResponseClosed | undefined
  /** `closed` was told: the line is written, nothing else may write one. */
  told = false
  /** The server ended the request with this status (cutByServer). */
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
  removeEventListener (_type: 'abort', listener: AbandonmentListener): void { if (this.#listener === listener) this.#listener = undefined }
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

/** The one 'close' listener of every watched response (`this` is the response). */
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

/**
 * The response's line is being written now: a later close tells its watch
 * nothing. False when the watch was told already (the line is written).
 */
export function answered (reply: FastifyReply): boolean {
  const watch = (reply.raw as Watched)[WATCH]
  if (watch === undefined) return true
  if (watch.told) return false
  watch.closed = undefined
  watch.told = true
  return true
}

/**
 * The server, not the client, ends this response's request: its idle timeout,
 * or a raw answer (408, 400) written onto the socket for a parser error. The
 * line then shows `status` (what was sent, or 408 for a timeout, as nginx
 * logs its own) and not a client that left. Returns the request's id, for the
 * raw answer to carry, when the response is watched. `undefined` takes it back.
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
