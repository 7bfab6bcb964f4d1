/**
 * The access line: one per request at `info` (and below), the request path's
 * only line when nothing goes wrong. It is written straight to the logger's
 * destination in the logger's own format, from the pieces pino itself would
 * use (its level number, time function, `pid`/`hostname` bindings and message
 * key), with a fixed set of fields: about 0.4 µs a line where pino's generic
 * object walk takes 1.1 µs. The destination batches lines into writes of at
 * least 4 KiB (server.ts).
 *
 * Exactly one line a request, also for those Fastify never reports as
 * completed: a client that closed its connection (FIN or RST) before the
 * answer finished gets its line when the connection closes, with status 499
 * (nginx's "client closed request"), the duration so far and
 * `"clientLeft":true` (also a pipelined request still waiting behind another,
 * src/http/front.ts); a request the server itself cut off (its timeouts, a raw
 * answer to a body cut short) gets the status it was answered, or 408 for
 * the idle timeout, and no clientLeft; an answer the framework wrote itself
 * (a URL the router cannot read, see frameworkErrors in app.ts) gets its line
 * when its response closes. All come from the response's one 'close' listener, which the
 * engine routes' client-gone signal shares (src/http/client-gone.ts).
 */
import { LogController, type FastifyBaseLogger, type FastifyReply, type FastifyRequest } from 'fastify'
import pino, { type Logger } from 'pino'
import { answered, watchResponse } from '../http/client-gone.js'
import { traceIdOf } from './trace-context.js'

/** nginx's "client closed request": the client left before its answer was finished. */
export const CLIENT_CLOSED_REQUEST = 499

/**
 * Writes one access line with the reply's status, or, for a request that
 * ended without its answer, `ended`: a client that left (499, and the line
 * says so with `"clientLeft":true`) or the status the server cut it off with.
 * Told, not read from the status: an engine may answer 499 itself.
 */
export type AccessLog = (
  request: FastifyRequest,
  reply: FastifyReply,
  ended?: { status: number; clientLeft: boolean }
) => void

interface Destination {
  write: (line: string) => unknown
}

const quote = JSON.stringify

/** A writer for `log`'s access lines; `log` must be pino (Fastify's own logger is). */
export function accessLog (log: FastifyBaseLogger): AccessLog {
  const logger = log as Logger
  const { symbols } = pino
  const stream = (logger as unknown as Record<symbol, Destination>)[symbols.streamSym]!
  const time = (logger as unknown as Record<symbol, () => string>)[symbols.timeSym]!
  // ,"pid":…,"hostname":"…" (and any other base bindings), already serialized by pino.
  const bindings = (logger as unknown as Record<symbol, string>)[symbols.chindingsSym] ?? ''
  const head = `{"level":${logger.levels.values.info!}`
  const tail = `,${quote((logger as unknown as Record<symbol, string>)[symbols.messageKeySym] ?? 'msg')}:"request"}\n`
  const left = `,"clientLeft":true${tail}`
  return (request, reply, ended) => {
    const status = ended?.status ?? reply.statusCode
    // traceId is our own hex (or a client's, checked to be hex); the rest is quoted. A client that
    // reset its connection before the answer ended leaves no address (request.ip undefined): null, so
    // the line stays JSON (JSON.stringify(undefined) is no JSON at all).
    stream.write(
      `${head}${time()}${bindings},"reqId":${quote(request.id)},"traceId":"${traceIdOf(request.raw)}","method":${quote(request.method)}` +
        `,"url":${quote(request.url)},"ip":${quote(request.ip ?? null)},"status":${status}` +
        `,"ms":${Math.round(reply.elapsedTime)}${ended?.clientLeft === true ? left : tail}`
    )
  }
}

/**
 * Fastify's log controller with the access line: Fastify tells it of every
 * request (incomingRequest: routes, 404s and the router's own refusals) and
 * of every answer it saw finish (requestCompleted, after the onResponse
 * hooks), so the line costs no hook of its own. Fastify's own request lines
 * stay off. Silent until `start` is given a logger at info or below.
 */
export class AccessLines extends LogController {
  #write: AccessLog | undefined = undefined

  constructor () {
    super({ disableRequestLogging: true, requestIdLogLabel: 'reqId' })
  }

  /** The level is fixed at start: a quieter one costs the request path nothing. */
  start (log: FastifyBaseLogger): void {
    if (['info', 'debug', 'trace'].includes(log.level)) this.#write = accessLog(log)
  }

  override incomingRequest (_request: FastifyRequest, reply: FastifyReply): void {
    if (this.#write === undefined) return
    // Node keeps a socket's peer address once it is asked for, and a closed socket can no longer
    // tell it: asked now, a client that leaves still has its address on the line (request.ip).
    // The line asked for it anyway; this asks earlier, and once per connection.
    void reply.raw.socket?.remoteAddress
    watchResponse(reply, this.#closed)
  }

  override requestCompleted (_error: Error | null | undefined, request: FastifyRequest, reply: FastifyReply): void {
    if (this.#write !== undefined && answered(reply)) this.#write(request, reply)
  }

  /**
   * A response closed without its line: the server cut the request off (its
   * status), the client left (499), or Fastify did not report the answer.
   */
  readonly #closed = (reply: FastifyReply, finished: boolean, cutStatus: number | undefined): void => {
    const clientLeft = cutStatus === undefined && !finished
    this.#write?.(reply.request, reply, {
      status: cutStatus ?? (clientLeft ? CLIENT_CLOSED_REQUEST : reply.statusCode),
      clientLeft
    })
  }
}
