/**
 * When an answer must end its connection, and how the connection then ends
 * (DECISIONS 21 and 32).
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
 * the client still sends is read and thrown away, for as long as the client
 * keeps up the uploads' minimum rate, up to the declared length. A body
 * declared beyond the linger bound (a few times the route's limit) is not
 * read at all: reading it would only serve a client that sends garbage, so
 * the socket stops reading and closes once the answer is out. A chunked body
 * is read up to the bound, then cut. Lingering sockets are capped in total
 * and per client address; past a cap the oldest is cut (Lingers).
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

/** What reading the rest of refused bodies may cost (LINGER_* in the environment). */
export interface LingerLimits {
  /** A body declared beyond this many times the route's limit is not read after a refusal. */
  readonly bodyFactor: number
  /** Lingering sockets at once, in all. */
  readonly maxSockets: number
  /** Lingering sockets at once from one client address. */
  readonly maxPerAddress: number
}

export const LINGER_LIMITS: LingerLimits = Object.freeze({ bodyFactor: 2, maxSockets: 1024, maxPerAddress: 16 })

/**
 * Watch what a lingering client sends (`received`: its socket's bytes so far) and call `cut` once it stalls or
 * falls under the minimum rate; the returned function stops the watch.
 */
export type RateWatch = (received: () => number, cut: () => void) => () => void

/** The client address a socket's caps count against: its peer, or the client a trusted proxy forwards. */
export type AddressOf = (socket: Socket, raw: IncomingMessage | undefined) => string

const peerAddress: AddressOf = (socket) => socket.remoteAddress ?? ''

interface LingerEntry {
  readonly address: string
  readonly cut: () => void
}

/**
 * The lingering sockets, oldest first, in all and per client address. A new one past a cap cuts the oldest:
 * the newest refusal is the one a client is about to read, and a client that holds a place by trickling at
 * the minimum rate is by then among the oldest, so slots cannot be held against newcomers.
 */
export class Lingers {
  readonly limits: LingerLimits
  readonly watchRate: RateWatch
  readonly addressOf: AddressOf
  readonly #all = new Set<LingerEntry>()
  readonly #byAddress = new Map<string, Set<LingerEntry>>()
  /** Lingers cut to make room, by the cap that was full. */
  readonly evicted = { total: 0, perAddress: 0 }

  constructor (limits: LingerLimits, watchRate: RateWatch, addressOf: AddressOf = peerAddress) {
    this.limits = limits
    this.watchRate = watchRate
    this.addressOf = addressOf
  }

  /** Lingering sockets now. */
  get size (): number {
    return this.#all.size
  }

  /** Lingering sockets now from `address`. */
  sizeOf (address: string): number {
    return this.#byAddress.get(address)?.size ?? 0
  }

  /** Count a new linger in, cutting the oldest where a cap is full; the returned function counts it out. */
  admit (address: string, cut: () => void): () => void {
    const entry: LingerEntry = { address, cut }
    const mine = this.#byAddress.get(address) ?? new Set<LingerEntry>()
    if (mine.size >= this.limits.maxPerAddress) this.#evict(mine.values().next().value, 'perAddress')
    if (this.#all.size >= this.limits.maxSockets) this.#evict(this.#all.values().next().value, 'total')
    this.#all.add(entry)
    mine.add(entry)
    this.#byAddress.set(address, mine)
    return () => { this.#remove(entry) }
  }

  #evict (entry: LingerEntry | undefined, cap: 'total' | 'perAddress'): void {
    if (entry === undefined) return
    this.evicted[cap]++
    this.#remove(entry)
    entry.cut()
  }

  #remove (entry: LingerEntry): void {
    if (!this.#all.delete(entry)) return
    const mine = this.#byAddress.get(entry.address)
    mine?.delete(entry)
    if (mine?.size === 0) this.#byAddress.delete(entry.address)
  }
}

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

/**
 * How many more bytes the linger after an answer to `raw` may read: the
 * declared body, or up to the bound for a chunked one; undefined when the
 * declared body is beyond the bound, which is then not read at all.
 */
export function lingerAllowance (raw: IncomingMessage, maxBodyBytes: number, bodyFactor: number): number | undefined {
  const bound = bodyFactor * maxBodyBytes
  if (raw.headers['transfer-encoding'] !== undefined) return bound
  const declared = Number(raw.headers['content-length'] ?? 0)
  return declared > bound ? undefined : declared
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
export function endsConnection (
  raw: IncomingMessage, lifecycle: { readonly draining: boolean }, maxBodyBytes: number, lingers: Lingers
): boolean {
  if (!bodyUnread(raw)) return lifecycle.draining
  lingerOnClose(raw, maxBodyBytes, lingers)
  return true
}

export function closeConnectionsWhenNeeded (
  app: FastifyInstance, lifecycle: { readonly draining: boolean }, lingers: Lingers
): void {
  app.addHook('onSend', (request, reply, payload, done) => {
    const limit = request.routeOptions.url === CREATE_PATH
      ? CREATE_BODY_MAX_BYTES
      : request.routeOptions.bodyLimit ?? SERVER_LIMITS.bodyLimitBytes
    if (endsConnection(request.raw, lifecycle, limit, lingers)) reply.header('connection', 'close')
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
export function lingerOnClose (raw: IncomingMessage, maxBodyBytes: number, lingers: Lingers): void {
  const socket = raw.socket as LingeringSocket
  if (Object.hasOwn(socket, 'destroySoon') || lingerOf(socket) !== undefined) return
  const allowance = lingerAllowance(raw, maxBodyBytes, lingers.limits.bodyFactor)
  if (allowance === undefined) {
    closeUnread(raw)
    return
  }
  // Counted from the answer: the rest of a declared body within the bound always fits.
  const maxBytesRead = socket.bytesRead + allowance
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
    linger = startLinger(socket, maxBytesRead, lingers, lingers.addressOf(socket, raw))
    linger.onStop(() => raw.off('data', onData))
    detachReaders(raw, onData)
  }
}

/**
 * A body declared beyond the bound: nothing more of it is read (the socket
 * stops reading now), and the socket closes once the answer is flushed.
 */
function closeUnread (raw: IncomingMessage): void {
  const socket = raw.socket
  raw.unpipe()
  socket.pause()
  socket.destroySoon = function closingDestroySoon () {
    Reflect.deleteProperty(socket, 'destroySoon')
    socket.pause()
    socket.destroySoon()
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
 * lingers until the client closes, at most `maxBytes` more, under the same rules.
 */
export function lingerAfterRawAnswer (socket: Socket, maxBytes: number, lingers: Lingers): Linger {
  const address = lingers.addressOf(socket, undefined)
  return startLinger(socket as LingeringSocket, socket.bytesRead + maxBytes, lingers, address)
}

export interface Linger {
  /** More bytes came: cut off past the byte bound. */
  sawBytes: () => void
  /** The client has sent all it will: close once the answer is flushed. */
  finish: () => void
  onStop: (fn: () => void) => void
}

function startLinger (socket: LingeringSocket, maxBytesRead: number, lingers: Lingers, address: string): Linger {
  const stops: Array<() => void> = []
  let stopped = false
  const stop = (cut: boolean): void => {
    if (stopped) return
    stopped = true
    for (const fn of stops) fn()
    // A cut closes with bytes unread (a reset): the client went past a bound, stalled, or lost its place.
    if (cut) socket.destroy()
    else socket.destroySoon() // the prototype's: destroy once the answer is flushed
  }
  stops.push(lingers.admit(address, () => stop(true)))
  stops.push(lingers.watchRate(() => socket.bytesRead, () => stop(true)))
  const linger: Linger = {
    sawBytes: () => {
      if (!stopped && socket.bytesRead > maxBytesRead) stop(true)
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
