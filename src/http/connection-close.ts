/**
 * When an answer ends its connection, and how: a refused body still arriving is read and thrown away while
 * the client keeps sending ("lingering"), so a client that writes its whole body before it reads gets the
 * answer instead of a reset. What that may cost, and why: [A refused upload is read to its end while the
 * client keeps sending](../../docs/decisions/0032-a-refused-upload-is-read-to-its-end.md).
 */
import type { FastifyInstance } from 'fastify'
import type { IncomingMessage } from 'node:http'
import { isIP, type Socket } from 'node:net'
import { CREATE_BODY_MAX_BYTES } from '../../schemas/portfolio.js'
import { SERVER_LIMITS } from './limits.js'

/** What reading the rest of refused bodies may cost (LINGER_* in the environment). */
export interface LingerLimits {
  /** A body beyond this many times the route's limit is not read past it after a refusal. */
  readonly bodyFactor: number
  /** Lingering sockets at once, in all. */
  readonly maxSockets: number
  /** Lingering sockets at once from one client address (an IPv6 /64). */
  readonly maxPerAddress: number
}

export const LINGER_LIMITS: LingerLimits = Object.freeze({ bodyFactor: 2, maxSockets: 1024, maxPerAddress: 16 })

/** Calls `cut` once a lingering client (`received`: its socket's bytes) stalls or is too slow; returns the stop. */
export type RateWatch = (received: () => number, cut: () => void) => () => void

/** The client address a socket's caps count against: its peer, or the client a trusted proxy forwards. */
export type AddressOf = (socket: Socket, raw: IncomingMessage | undefined) => string

const peerAddress: AddressOf = (socket) => socket.remoteAddress ?? ''

export type LingerCap = 'total_cap' | 'address_cap'
/** Why the gateway cuts a linger itself: a cap is full, or the gateway is closing (a linger holds no request). */
export type LingerCut = LingerCap | 'shutdown'
/**
 * Why a linger ended: the body was read to its end; the client closed, half-closed or reset; the gateway
 * closed the socket otherwise (its idle timeout); it stalled or fell under the minimum rate; it sent past the
 * byte bound; a cap was full; or the gateway was closing.
 */
export type LingerEnd = 'complete' | 'client_closed' | 'server_closed' | 'too_slow' | 'over_bound' | LingerCut

/** For the metrics and the log; `requestId` is the refused request's. */
export interface LingerEvents {
  started: () => void
  ended: (reason: LingerEnd) => void
  cut: (cap: LingerCap, requestId: string | undefined) => void
}

const NO_EVENTS: LingerEvents = { started: () => {}, ended: () => {}, cut: () => {} }

/**
 * The host in a client address as a peer or a balancer gives it: `[v6]`, `[v6]:port` and `v4:port` lose the
 * brackets and the port, an IPv6 zone is dropped.
 */
function hostOf (address: string): string {
  const bracketed = /^\[([^\]]*)\](?::\d*)?$/.exec(address)
  if (bracketed !== null) return bracketed[1]!.split('%', 1)[0]!
  const v4WithPort = /^(\d+\.\d+\.\d+\.\d+):\d*$/.exec(address)
  return v4WithPort?.[1] ?? address.split('%', 1)[0]!
}

/**
 * The key a client address is counted under: an IPv6 address by its /64 (what one subscriber gets), an
 * IPv4-mapped one, however spelled, as the IPv4 address, anything else as it is.
 */
export function addressKey (address: string): string {
  const host = hostOf(address)
  if (isIP(host) === 4) return host
  if (isIP(host) !== 6) return address
  // The URL parser's form: lower case, zeros compressed, an embedded IPv4 address in hex.
  const canonical = new URL(`http://[${host}]`).hostname.slice(1, -1)
  const mapped = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(canonical)
  if (mapped !== null) {
    const [high, low] = [Number.parseInt(mapped[1]!, 16), Number.parseInt(mapped[2]!, 16)]
    return [high >> 8, high & 255, low >> 8, low & 255].join('.')
  }
  const [left = '', right] = canonical.split('::')
  const head = left === '' ? [] : left.split(':')
  if (right !== undefined) {
    const tail = right === '' ? [] : right.split(':')
    head.push(...Array<string>(8 - head.length - tail.length).fill('0'), ...tail)
  }
  return head.slice(0, 4).join(':') + '::/64'
}

interface LingerEntry {
  readonly key: string
  readonly seq: number
  readonly requestId: string | undefined
  /** How long its body has left at its recent rate, in ms: Infinity when nothing says (chunked, no recent bytes). */
  readonly timeLeft: () => number
  readonly cut: (reason: LingerCut) => void
}

/**
 * Of `entries`, the linger with the most time left to its end (on a tie, the newest): the one that would hold
 * its place longest. A slow phone near its end is kept; an unknown end (a chunked body, no bytes yet) goes first.
 */
function longestLeft (entries: Iterable<LingerEntry>): LingerEntry | undefined {
  let pick: LingerEntry | undefined
  let most = -1
  for (const entry of entries) {
    const left = entry.timeLeft()
    if (pick === undefined || left > most || (left === most && entry.seq > pick.seq)) {
      pick = entry
      most = left
    }
  }
  return pick
}

/**
 * The lingering sockets, in all and per address key. Past the per-address cap, the address's linger with the
 * most time left is cut; past the total cap, the one with the most time left among the addresses holding the
 * most, so a flood from many addresses cuts its own before a client that holds one, and among addresses holding
 * one each, the slow client about to finish is not the one cut for being the oldest.
 */
export class Lingers {
  readonly limits: LingerLimits
  readonly watchRate: RateWatch
  readonly addressOf: AddressOf
  readonly events: LingerEvents
  readonly #all = new Set<LingerEntry>()
  readonly #byKey = new Map<string, Set<LingerEntry>>()
  #seq = 0
  #closed = false

  constructor (limits: LingerLimits, watchRate: RateWatch, addressOf: AddressOf = peerAddress, events = NO_EVENTS) {
    this.limits = limits
    this.watchRate = watchRate
    this.addressOf = addressOf
    this.events = events
  }

  get size (): number {
    return this.#all.size
  }

  /** Lingering sockets now counted against `address`'s key. */
  sizeOf (address: string): number {
    return this.#byKey.get(addressKey(address))?.size ?? 0
  }

  /**
   * Count a new linger in, cutting where a cap is full (`timeLeft`: how long its body has left, for choosing
   * which); the returned function counts it out, saying why. Once closed, a new linger is cut at once.
   */
  admit (
    address: string, requestId: string | undefined, cut: (reason: LingerCut) => void, timeLeft = () => Infinity
  ): (reason: LingerEnd) => void {
    const key = addressKey(address)
    const mine = this.#byKey.get(key)
    if (mine !== undefined && mine.size >= this.limits.maxPerAddress) this.#cut(longestLeft(mine), 'address_cap')
    if (this.#all.size >= this.limits.maxSockets) this.#cut(longestLeft(this.#ofLargest()), 'total_cap')
    const entry: LingerEntry = { key, seq: this.#seq++, requestId, timeLeft, cut }
    this.#all.add(entry)
    const now = this.#byKey.get(key) ?? new Set<LingerEntry>()
    now.add(entry)
    this.#byKey.set(key, now)
    this.events.started()
    if (this.#closed) this.#cut(entry, 'shutdown')
    return (reason) => { if (this.#remove(entry)) this.events.ended(reason) }
  }

  /** The gateway is closing: every linger is cut now, and any that starts later at once. */
  closeAll (): void {
    this.#closed = true
    for (const entry of [...this.#all]) this.#cut(entry, 'shutdown')
  }

  /** The lingers of the addresses holding the most: a scan of at most maxSockets, paid only when the cap is full. */
  * #ofLargest (): Iterable<LingerEntry> {
    let most = 0
    for (const entries of this.#byKey.values()) most = Math.max(most, entries.size)
    for (const entries of this.#byKey.values()) if (entries.size === most) yield * entries
  }

  #cut (entry: LingerEntry | undefined, reason: LingerCut): void {
    if (entry === undefined || !this.#remove(entry)) return
    this.events.ended(reason)
    if (reason !== 'shutdown') this.events.cut(reason, entry.requestId)
    entry.cut(reason)
  }

  #remove (entry: LingerEntry): boolean {
    if (!this.#all.delete(entry)) return false
    const mine = this.#byKey.get(entry.key)
    mine?.delete(entry)
    if (mine?.size === 0) this.#byKey.delete(entry.key)
    return true
  }
}

/** The create route reads its body itself, past Fastify's bodyLimit: its own bound applies. */
export const CREATE_PATH = '/api/portfolio/create'

/** The body limit of the route at `path` (the router's path): its own `routeLimit` if it has one, else the server's. */
export function bodyLimitOf (path: string | undefined, routeLimit?: number): number {
  return path === CREATE_PATH ? CREATE_BODY_MAX_BYTES : routeLimit ?? SERVER_LIMITS.bodyLimitBytes
}

/**
 * Body bytes the server has not read. A request without a body is marked `complete` only just after the
 * 'request' event, so a synchronous early answer would otherwise close a socket with nothing unread.
 */
export function bodyUnread (raw: IncomingMessage): boolean {
  if (raw.complete) return false
  const { 'transfer-encoding': chunked, 'content-length': length } = raw.headers
  return chunked !== undefined || (length !== undefined && length !== '0')
}

/**
 * How many body bytes, from the body's start, a linger after an answer to `raw` may read: the declared
 * length, or the bound for a chunked body; undefined when the declared body is beyond the bound.
 */
export function lingerAllowance (raw: IncomingMessage, maxBodyBytes: number, bodyFactor: number): number | undefined {
  const bound = bodyFactor * maxBodyBytes
  if (raw.headers['transfer-encoding'] !== undefined) return bound
  const declared = Number(raw.headers['content-length'] ?? 0)
  return declared > bound ? undefined : declared
}

const kBodyStart = Symbol('gateway.bodyStart')
type MarkedRequest = IncomingMessage & { [kBodyStart]?: number }

/** Note where `raw`'s body starts on its socket, at most one read late: a linger's byte bound counts from there. */
export function markBodyStart (raw: IncomingMessage): void {
  (raw as MarkedRequest)[kBodyStart] = raw.socket.bytesRead
}

export function mustCloseConnection (raw: IncomingMessage, lifecycle: { readonly draining: boolean }): boolean {
  return lifecycle.draining || bodyUnread(raw)
}

/**
 * For an answer about to be sent on `raw` (request `requestId`): true when it must say `connection: close`.
 * When the body is unread, the socket lingers before it closes (`maxBodyBytes`: the route's body limit).
 */
export function endsConnection (
  raw: IncomingMessage, lifecycle: { readonly draining: boolean }, maxBodyBytes: number, lingers: Lingers,
  requestId?: string
): boolean {
  if (!bodyUnread(raw)) return lifecycle.draining
  lingerOnClose(raw, maxBodyBytes, lingers, requestId)
  return true
}

export function closeConnectionsWhenNeeded (
  app: FastifyInstance, lifecycle: { readonly draining: boolean }, lingers: Lingers
): void {
  app.addHook('onSend', (request, reply, payload, done) => {
    const limit = bodyLimitOf(request.routeOptions.url, request.routeOptions.bodyLimit)
    if (endsConnection(request.raw, lifecycle, limit, lingers, request.id)) reply.header('connection', 'close')
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

/**
 * Node calls `socket.destroySoon()` after the last answer on a connection: an own `destroySoon` lingers first.
 * The body is read from now on, so Node does not dump it unseen when the answer ends; a handler still reading
 * it keeps it until the answer is out.
 */
export function lingerOnClose (raw: IncomingMessage, maxBodyBytes: number, lingers: Lingers, requestId?: string): void {
  const socket = raw.socket as LingeringSocket
  if (lingerArmed(socket)) return
  const allowance = lingerAllowance(raw, maxBodyBytes, lingers.limits.bodyFactor)
  if (allowance === undefined) {
    closeUnread(raw)
    return
  }
  const maxBytesRead = ((raw as MarkedRequest)[kBodyStart] ?? socket.bytesRead) + allowance
  let linger: Linger | undefined
  const unconsumed = raw.listenerCount('data') === 0 && raw.listenerCount('readable') === 0
  // Past the bound before the answer is out, nothing more is read: the linger then cuts at once.
  const onData = (): void => {
    if (linger !== undefined) linger.sawBytes()
    else if (socket.bytesRead > maxBytesRead) socket.pause()
  }
  raw.on('data', onData)
  raw.once('end', () => linger?.finish('complete'))
  if (unconsumed) raw.resume()
  socket.destroySoon = function lingeringDestroySoon () {
    Reflect.deleteProperty(socket, 'destroySoon')
    if (raw.complete || socket.destroyed) {
      raw.off('data', onData)
      socket.destroySoon()
      return
    }
    const chunked = raw.headers['transfer-encoding'] !== undefined
    const address = lingers.addressOf(socket, raw)
    linger = startLinger(socket, maxBytesRead, lingers, { address, requestId, declared: !chunked })
    linger.onStop(() => raw.off('data', onData))
    detachReaders(raw, onData)
    if (chunked) readRaw(socket, linger)
  }
}

/** A body declared beyond the bound: nothing more is read, and the socket closes once the answer is flushed. */
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
 * A chunked body costs Node's parser a callback, a Buffer and an event per chunk: 1-byte chunks up to the bound
 * cost seconds of CPU. Nothing needs a refused body's framing, so the parser is taken off the socket (Node's
 * server unconsumes it when a 'data' listener is added, and its own listener goes) and raw reads are counted and
 * dropped, as nginx's lingering close does: the body then ends at the bound, a stall, or the client's FIN.
 */
function readRaw (socket: Socket, linger: Linger): void {
  const drop = (): void => { linger.sawBytes() }
  socket.on('data', drop)
  for (const listener of socket.listeners('data')) if (listener !== drop) socket.off('data', listener as () => void)
  linger.onStop(() => { socket.off('data', drop) })
  socket.resume()
}

/**
 * The answer is out: only the linger reads `raw` now. A form parser left piped would hold the body back
 * until its current part is read, which nobody will do, and the linger would see only silence.
 */
function detachReaders (raw: IncomingMessage, keep: (chunk: Buffer) => void): void {
  raw.unpipe()
  for (const listener of raw.listeners('data') as Array<(chunk: Buffer) => void>) {
    if (listener !== keep) raw.off('data', listener)
  }
  raw.removeAllListeners('readable')
  raw.resume()
}

/**
 * After an answer to what Node's parser could not read as a request (client-error.ts): the body cannot be told
 * from what follows, so the socket lingers until the client closes, at most `maxBytes` more.
 */
export function lingerAfterRawAnswer (socket: Socket, maxBytes: number, lingers: Lingers, requestId?: string): Linger {
  const address = lingers.addressOf(socket, undefined)
  const who = { address, requestId, declared: false }
  return startLinger(socket as LingeringSocket, socket.bytesRead + maxBytes, lingers, who)
}

export interface Linger {
  /** More bytes came: cut off past the byte bound. */
  sawBytes: () => void
  /** The client sent all it will (the body's end, or its FIN): close once the answer is flushed. */
  finish: (reason: 'complete' | 'client_closed') => void
  onStop: (fn: () => void) => void
}

/** How far back the rate that estimates a linger's time left looks: a burst long ago says nothing of now. */
const RECENT_RATE_MS = 5_000

/**
 * How long a declared body has left at the rate of its last few seconds, in ms (Infinity while nothing says), and a
 * `sample` to call as bytes come. A client that sends most of its body at once and then trickles would look nearly
 * done by its average since the start, and a phone keeping up its pace would be cut in its place.
 */
function timeLeft (
  socket: Socket, maxBytesRead: number, declared: boolean
): { left: () => number, sample: () => void } {
  if (!declared) return { left: () => Infinity, sample: () => {} }
  // Checkpoints of (time, bytes read), one a second at most, the oldest first, none older than the window needs.
  const marks: Array<[number, number]> = [[performance.now(), socket.bytesRead]]
  const sample = (): void => {
    const now = performance.now()
    if (now - marks[marks.length - 1]![0] < 1_000) return
    marks.push([now, socket.bytesRead])
    while (marks.length > 2 && now - marks[1]![0] >= RECENT_RATE_MS) marks.shift()
  }
  const left = (): number => {
    const now = performance.now()
    const [since, bytes] = marks.find(([at]) => now - at <= RECENT_RATE_MS) ?? marks[marks.length - 1]!
    const received = socket.bytesRead - bytes
    if (received <= 0) return Infinity
    return Math.max(0, maxBytesRead - socket.bytesRead) * (now - since) / received
  }
  return { left, sample }
}

function startLinger (
  socket: LingeringSocket, maxBytesRead: number, lingers: Lingers,
  who: { address: string, requestId: string | undefined, declared: boolean }
): Linger {
  const stops: Array<() => void> = []
  let stopped: LingerEnd | undefined
  const stop = (reason: LingerEnd): void => {
    if (stopped !== undefined) return
    stopped = reason
    for (const fn of stops) fn()
    // A cut closes with bytes unread, which resets; an ended body closes once the answer is flushed.
    if (reason === 'complete' || reason === 'client_closed') socket.destroySoon()
    else socket.destroy()
  }
  const estimate = timeLeft(socket, maxBytesRead, who.declared)
  const linger: Linger = {
    sawBytes: () => {
      estimate.sample()
      if (socket.bytesRead > maxBytesRead) stop('over_bound')
    },
    finish: stop,
    // A linger cut as it is admitted (the gateway closing) runs its stops at once.
    onStop: (fn) => { if (stopped === undefined) stops.push(fn); else fn() }
  }
  const release = lingers.admit(who.address, who.requestId, stop, estimate.left)
  linger.onStop(() => { release(stopped!) })
  linger.onStop(lingers.watchRate(() => socket.bytesRead, () => stop('too_slow')))
  socket[kLinger] = linger
  socket.once('end', () => stop('client_closed'))
  // A reset (an error first) is the client's doing; a close without one is the gateway's (its idle timeout).
  socket.once('close', (hadError: boolean) => stop(hadError ? 'client_closed' : 'server_closed'))
  // The answer is flushed, then FIN; the read side stays open.
  socket.end()
  linger.sawBytes()
  return linger
}
