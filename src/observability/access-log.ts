/**
 * The access line, one per request at `info` and below. It is written straight to the logger's destination in
 * pino's own format with a fixed set of fields, which is cheaper than pino's generic object walk.
 *
 * Every request gets exactly one line, also those Fastify never reports complete: a client that left gets 499 and
 * `"clientLeft":true`, a request the server cut off gets the status it was answered (408 for the idle timeout). Those
 * come from the response's one 'close' listener, shared with the client-gone signal (src/http/client-gone.ts).
 */
import { LogController, type FastifyBaseLogger, type FastifyReply, type FastifyRequest } from 'fastify'
import pino, { type Logger } from 'pino'
import { answered, watchResponse } from '../http/client-gone.js'
import { traceIdOf } from './trace-context.js'

/** nginx's "client closed request": the client left before its answer was finished. */
export const CLIENT_CLOSED_REQUEST = 499

/** Writes one access line; `ended` is told, not read from the status, since an engine may answer 499 itself. */
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
  const bindings = (logger as unknown as Record<symbol, string>)[symbols.chindingsSym] ?? ''
  const head = `{"level":${logger.levels.values.info!}`
  const tail = `,${quote((logger as unknown as Record<symbol, string>)[symbols.messageKeySym] ?? 'msg')}:"request"}\n`
  const left = `,"clientLeft":true${tail}`
  return (request, reply, ended) => {
    const status = ended?.status ?? reply.statusCode
    // traceId is hex, checked; the rest is quoted. A client that reset its connection has no address: null keeps
    // the line JSON.
    stream.write(
      `${head}${time()}${bindings},"reqId":${quote(request.id)},"traceId":"${traceIdOf(request.raw)}"` +
        `,"method":${quote(request.method)}` +
        `,"url":${quote(request.url)},"ip":${quote(request.ip ?? null)},"status":${status}` +
        `,"ms":${Math.round(reply.elapsedTime)}${ended?.clientLeft === true ? left : tail}`
    )
  }
}

/**
 * Fastify's log controller with the access line: Fastify tells it of every request and every finished answer, so
 * the line costs no hook of its own. Silent until `start` is given a logger at info or below.
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
    // Node remembers a peer address once asked, and a closed socket cannot tell it: asked now, a client that leaves
    // still has its address on the line.
    void reply.raw.socket?.remoteAddress
    watchResponse(reply, this.#closed)
  }

  override requestCompleted (_error: Error | null | undefined, request: FastifyRequest, reply: FastifyReply): void {
    if (this.#write !== undefined && answered(reply)) this.#write(request, reply)
  }

  /** A response closed without its line: the server cut the request off, the client left, or Fastify did not say. */
  readonly #closed = (reply: FastifyReply, finished: boolean, cutStatus: number | undefined): void => {
    const clientLeft = cutStatus === undefined && !finished
    this.#write?.(reply.request, reply, {
      status: cutStatus ?? (clientLeft ? CLIENT_CLOSED_REQUEST : reply.statusCode),
      clientLeft
    })
  }
}
