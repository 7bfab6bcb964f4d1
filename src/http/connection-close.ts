/**
 * When an answer must end its connection (DECISIONS 21):
 * - the request's body is not completely read (a 401 from the JWT hook, a 404,
 *   a 429 or 503 before the body, an engine that answered mid-upload). Node
 *   would otherwise read and discard the rest, however long, to keep the socket;
 *   `connection: close` makes it close the socket after the answer instead;
 * - the gateway is draining: a client learns from the answer that this socket
 *   is going, so no request is sent on it in the moment the listener closes it
 *   (issue 7 item 12).
 * One onSend hook for every route, so each new early answer gets it for free.
 */
import type { FastifyInstance } from 'fastify'
import type { IncomingMessage } from 'node:http'

/**
 * Body bytes the server has not read. A request without a body is not marked
 * `complete` until just after the 'request' event, so a synchronous early
 * answer would otherwise close a socket that has nothing unread.
 */
export function bodyUnread (raw: IncomingMessage): boolean {
  if (raw.complete) return false
  const { 'transfer-encoding': chunked, 'content-length': length } = raw.headers
  return chunked !== undefined || (length !== undefined && length !== '0')
}

/** The rule itself: an answer to `raw` ends its connection. Also used by the shedder, which answers before Fastify. */
export function mustCloseConnection (raw: IncomingMessage, lifecycle: { readonly draining: boolean }): boolean {
  return lifecycle.draining || bodyUnread(raw)
}

export function closeConnectionsWhenNeeded (app: FastifyInstance, lifecycle: { readonly draining: boolean }): void {
  app.addHook('onSend', (request, reply, payload, done) => {
    if (mustCloseConnection(request.raw, lifecycle)) reply.header('connection', 'close')
    done(null, payload)
  })
}
