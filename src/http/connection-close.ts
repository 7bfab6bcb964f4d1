/**
 * When an answer must end its connection, and how the connection then ends (DECISIONS 21 v4).
 *
 * An answer ends its connection when
 * - the request's body is not completely read (a 401 from the JWT hook, a 404,
 *   a 429 or 503 before the body, a bad field, a non-image or a second file
 *   met mid-form, the size limit, an engine that answered mid-upload, a
 *   502/504 mid-upload): Node would otherwise read and discard the rest,
 *   however long, to keep the socket;
 * - the gateway is draining: a client learns from the answer that this socket
 *   is going, so no request is sent on it in the moment the listener closes it.
 *
 * A connection that ends while the client is still sending its body is not
 * closed at once: closing a socket with unread bytes makes the kernel send a
 * reset, and a client that writes its whole body before it reads (python's
 * http.client, undici's fetch, Android's HttpURLConnection in fixed-length
 * mode) then loses the answer to EPIPE/ECONNRESET. Like nginx's lingering
 * close, the write side is ended (the answer is flushed, then FIN), and what
 * the client still sends is read and discarded: until the declared body is
 * complete when it is at most 4x the route's limit (a chunked body: up to 4x
 * the limit), at most 5 s without a byte and 30 s in all. Only then is the
 * socket closed. A body declared larger than 4x the limit is read up to that
 * bound, then cut.
 *
 * One mechanism for every refusal, whoever gives it: when the answer has gone
 * out, whatever still reads the body (the form parser piped from it, a
 * handler's listener) is detached and the linger alone reads on. A form
 * parser left attached holds the body back until its current part is read,
 * which nobody will do once the answer is out: the socket stays paused and
 * the linger would only ever see silence.
 *
 * The hook is the one Node itself uses: after the last answer on a connection
 * Node calls `socket.destroySoon()` (http server, resOnFinish). An answer that
 * leaves the body unread gives its socket an own `destroySoon` that lingers
 * first. Every early answer goes through `endsConnection`: the onSend hook
 * below, and the answers given in front of Fastify (front.ts).
 */
import type { FastifyInstance } from 'fastify'
import type { IncomingMessage } from 'node:http'
import type { Socket } from 'node:net'
import { CREATE_BODY_MAX_BYTES } from '../../schemas/portfolio.js'
import { SERVER_LIMITS } from './limits.js'

export interface LingerBounds {
  /** Longest wait for the client's next byte. */
  readonly idleMs: number
  /** Longest linger in all, from the answer's end. */
  readonly totalMs: number
}

/** DECISIONS 21; tests pass shorter ones through AppDeps. */
export const LINGER_BOUNDS: LingerBounds = Object.freeze({ idleMs: 5_000, totalMs: 30_000 })

/** The create route reads its body itself, past Fastify's bodyLimit: its own bound applies. */
export const CREATE_PATH = '/api/portfolio/create'

/**
 * The body limit of the route at `path` (the router's path), for answers given
 * before a route is known: create's own bound, otherwise the server's (which
 * every other route keeps, update included).
 */
export function bodyLimitOf (path: string | undefined): number {
  return path === CREATE_PATH ? CREATE_BODY_MAX_BYTES : SERVER_LIMITS.bodyLimitBytes
}

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

/** DECISIONS 21 v4: the linger reads at most this many times the route's body limit. */
export const LINGER_BODY_FACTOR = 4

/**
 * How many more bytes the linger after an answer to `raw` reads: the declared
 * body when it is at most 4x the route's limit, otherwise (chunked, or
 * declared larger) up to 4x the limit, then the socket is cut.
 */
export function lingerAllowance (raw: IncomingMessage, maxBodyBytes: number): number {
  const most = LINGER_BODY_FACTOR * maxBodyBytes
  const declared = raw.headers['transfer-encoding'] === undefined ? Number(raw.headers['content-length'] ?? 0) : most
  return Math.min(declared, most)
}

/** The rule itself: an answer to `raw` ends its connection. */
export function mustCloseConnection (raw: IncomingMessage, lifecycle: { readonly draining: boolean }): boolean {
  return lifecycle.draining || bodyUnread(raw)
}

/**
 * For an answer about to be sent on `raw`: true when it must say
 * `connection: close`. When the body is unread, the socket lingers before it
 * closes (`maxBodyBytes` is the route's body limit; see lingerAllowance).
 */
export function endsConnection (raw: IncomingMessage, lifecycle: { readonly draining: boolean }, maxBodyBytes: number, bounds: LingerBounds): boolean {
  if (!bodyUnread(raw)) return lifecycle.draining
  lingerOnClose(raw, maxBodyBytes, bounds)
  return true
}

export function closeConnectionsWhenNeeded (app: FastifyInstance, lifecycle: { readonly draining: boolean }, bounds: LingerBounds): void {
  app.addHook('onSend', (request, reply, payload, done) => {
    const limit = request.routeOptions.url === CREATE_PATH ? CREATE_BODY_MAX_BYTES : request.routeOptions.bodyLimit ?? SERVER_LIMITS.bodyLimitBytes
    if (endsConnection(request.raw, lifecycle, limit, bounds)) reply.header('connection', 'close')
    done(null, payload)
  })
}

const kLinger = Symbol('gateway.linger')
type LingeringSocket = Socket & { [kLinger]?: Linger }

/** The linger under way on `socket`, if any (front.ts refuses requests that arrive on it). */
export function lingerOf (socket: Socket): Linger | undefined {
  return (socket as LingeringSocket)[kLinger]
}

/** An answer on `socket` will end it with a linger (lingerOnClose), or the linger is under way. */
export function lingerArmed (socket: Socket): boolean {
  return Object.hasOwn(socket, 'destroySoon') || lingerOf(socket) !== undefined
}

/** Arrange that when Node closes `raw`'s connection after the answer, the socket lingers first. */
export function lingerOnClose (raw: IncomingMessage, maxBodyBytes: number, bounds: LingerBounds): void {
  const socket = raw.socket as LingeringSocket
  if (Object.hasOwn(socket, 'destroySoon') || lingerOf(socket) !== undefined) return
  // Counted from the answer: the rest of a declared body within the bound always fits.
  const maxBytesRead = socket.bytesRead + lingerAllowance(raw, maxBodyBytes)
  let linger: Linger | undefined
  // Read the body from now on, so Node does not "dump" the request when the
  // answer ends: a dumped request's bytes are dropped by the parser unseen,
  // and the linger needs to see them arrive (and the body end). A request
  // that a handler is still reading keeps its reader until the answer is out.
  const unconsumed = raw.listenerCount('data') === 0 && raw.listenerCount('readable') === 0
  const onData = (): void => linger?.sawBytes()
  raw.on('data', onData)
  raw.once('end', () => linger?.finish())
  if (unconsumed) raw.resume()
  socket.destroySoon = function lingeringDestroySoon () {
    Reflect.deleteProperty(socket, 'destroySoon')
    if (raw.complete || socket.destroyed) {
      raw.off('data', onData)
      socket.destroySoon()
      return
    }
    linger = startLinger(socket, maxBytesRead, bounds)
    linger.onStop(() => raw.off('data', onData))
    detachReaders(raw, onData)
  }
}

/**
 * The answer is out: nothing but the linger reads `raw` any more. The form
 * parser (busboy, piped by @fastify/multipart) is unpiped, other readers are
 * dropped, and the body flows into `keep` alone.
 */
function detachReaders (raw: IncomingMessage, keep: (chunk: Buffer) => void): void {
  raw.unpipe()
  for (const listener of raw.listeners('data')) if (listener !== keep) raw.off('data', listener as (chunk: Buffer) => void)
  raw.removeAllListeners('readable')
  raw.resume()
}

/**
 * After an answer that Node's parser could not even read a request for
 * (client-error.ts): the body cannot be told from what follows, so the socket
 * lingers until the client closes, at most `maxBytes` more, within the bounds.
 */
export function lingerAfterRawAnswer (socket: Socket, maxBytes: number, bounds: LingerBounds): Linger {
  return startLinger(socket as LingeringSocket, socket.bytesRead + maxBytes, bounds)
}

export interface Linger {
  /** More bytes came: cut off past the byte bound, else the idle clock starts again. */
  sawBytes: () => void
  /** The client has sent all it will: close once the answer is flushed. */
  finish: () => void
  onStop: (fn: () => void) => void
}

function startLinger (socket: LingeringSocket, maxBytesRead: number, bounds: LingerBounds): Linger {
  const stops: Array<() => void> = []
  let stopped = false
  const stop = (cut: boolean): void => {
    if (stopped) return
    stopped = true
    clearTimeout(idle)
    clearTimeout(total)
    for (const fn of stops) fn()
    // A cut closes with bytes unread (a reset): the client went past a bound.
    if (cut) socket.destroy()
    else socket.destroySoon() // the prototype's: destroy once the answer is flushed
  }
  const idle = setTimeout(() => stop(true), bounds.idleMs)
  const total = setTimeout(() => stop(true), bounds.totalMs)
  const linger: Linger = {
    sawBytes: () => {
      if (stopped) return
      if (socket.bytesRead > maxBytesRead) stop(true)
      else idle.refresh()
    },
    finish: () => stop(false),
    onStop: (fn) => { stops.push(fn) }
  }
  socket[kLinger] = linger
  socket.once('end', linger.finish) // the client half-closed: it sends nothing more
  socket.once('close', () => stop(false))
  // Half-close: the answer is flushed, then FIN; the read side stays open.
  socket.end()
  return linger
}
