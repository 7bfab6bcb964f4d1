/**
 * A signal that a client went away before its answer was sent: the
 * connection closed while the response was unfinished. An IncomingMessage's
 * own 'close' is no use for this: it fires as soon as a body is read whole.
 */
import type { FastifyReply } from 'fastify'
import { validationError } from './errors.js'

export interface ClientGone {
  readonly signal: AbortSignal
  /** Stop watching (the answer is being sent or the handler is done). */
  done: () => void
}

export function watchClientGone (reply: FastifyReply): ClientGone {
  const controller = new AbortController()
  const res = reply.raw
  const onClose = (): void => {
    if (!res.writableFinished) controller.abort(validationError('the client went away before its answer was sent'))
  }
  if (res.destroyed || res.socket?.destroyed === true) onClose()
  else res.once('close', onClose)
  return { signal: controller.signal, done: () => { res.off('close', onClose) } }
}
