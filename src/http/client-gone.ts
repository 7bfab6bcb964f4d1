/**
 * A signal that a client went away before its answer was sent: the
 * connection closed while the response was unfinished. An IncomingMessage's
 * own 'close' is no use for this: it fires as soon as a body is read whole.
 *
 * Not an AbortSignal: every ping and update carries one, and an AbortController
 * with its EventTarget listener cost a ping about a quarter of its CPU in the
 * bench. This is the part of an AbortSignal the engine client uses, one listener.
 */
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

class Gone implements Abandonment {
  aborted = false
  reason: unknown = undefined
  #listener: AbandonmentListener | undefined = undefined
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

export function watchClientGone (reply: FastifyReply): ClientGone {
  const gone = new Gone()
  const res = reply.raw
  const onClose = (): void => {
    if (!res.writableFinished) gone.abort(validationError('the client went away before its answer was sent'))
  }
  if (res.destroyed || res.socket?.destroyed === true) onClose()
  else res.on('close', onClose)
  return { signal: gone, done: () => { res.off('close', onClose) } }
}
