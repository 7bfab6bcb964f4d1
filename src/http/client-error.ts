/**
 * Answers to what Node's HTTP parser refuses before any route runs (431, 408, 400): the gateway's shape, an id,
 * and `connection: close` before the socket ends, then a linger (connection-close.ts), so a client still
 * sending reads the answer instead of a reset. A request already in the framework whose body was cut short
 * (the request timeout, a half-close mid-body) gets this answer as its own: its id, and its access line shows
 * the status sent (client-gone.ts cutByServer).
 */
import { STATUS_CODES, type ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import { REQUEST_ID_HEADER } from '../../schemas/upstream.js'
import { CREATE_BODY_MAX_BYTES } from '../../schemas/portfolio.js'
import { cutByServer } from './client-gone.js'
import { lastOwedResponse } from './front.js'
import { newRequestId } from './request-id.js'
import { lingerAfterRawAnswer, lingerArmed, lingerOf, type Lingers } from './connection-close.js'

const ANSWERS: Readonly<Record<string, readonly [number, string]>> = {
  HPE_HEADER_OVERFLOW: [431, 'request headers too large'],
  ERR_HTTP_REQUEST_TIMEOUT: [408, 'request timed out'],
  HPE_HEADERS_TIMEOUT: [408, 'request timed out'],
  HPE_CHUNK_EXTENSIONS_OVERFLOW: [413, 'chunk extensions too large']
}
const MALFORMED: readonly [number, string] = [400, 'malformed HTTP request']

/** The socket's parser error waits for the answers owed before it (clientErrorAnswerer). */
const kDeferred = Symbol('gateway.clientErrorDeferred')
type DeferringSocket = Socket & { [kDeferred]?: boolean }

const answerTo = (code: string | undefined): readonly [number, string] =>
  (code === undefined ? undefined : ANSWERS[code]) ?? MALFORMED

/** The raw HTTP answer for a parser error: simple shape, an id, and the socket's end said out loud. */
export function clientErrorAnswer (code: string | undefined, requestId: string = newRequestId()): string {
  const [status, message] = answerTo(code)
  const body = JSON.stringify({ error: message })
  return (
    `HTTP/1.1 ${status} ${STATUS_CODES[status]!}\r\n` +
    'content-type: application/json; charset=utf-8\r\n' +
    `content-length: ${Buffer.byteLength(body)}\r\n` +
    `${REQUEST_ID_HEADER}: ${requestId}\r\n` +
    'connection: close\r\n\r\n' +
    body
  )
}

/** Told of each parser refusal: no access line is written for them. */
export type ParserRefused = (status: number, code: string | undefined, requestId: string) => void

function rawAnswer (
  code: string | undefined,
  refused: ParserRefused | undefined,
  requestId: string = newRequestId()
): string {
  refused?.(answerTo(code)[0], code, requestId)
  return clientErrorAnswer(code, requestId)
}

/** Fastify's `clientErrorHandler`; the route is unknown, so a linger allows what the largest body's route would. */
export function clientErrorAnswerer (
  lingers: Lingers,
  refused?: ParserRefused
): (err: NodeJS.ErrnoException, socket: Socket) => void {
  return (err, socket) => {
    if (err.code === 'ECONNRESET' || socket.destroyed) return
    // A parser in error reports every further chunk, and the end of a body cut short, as another error.
    const linger = lingerOf(socket)
    if (linger !== undefined) {
      if (socket.readableEnded) linger.finish('client_closed')
      else linger.sawBytes()
      return
    }
    // An early answer is on its way and will linger: the parser failed on the body it was not going to read.
    if (lingerArmed(socket)) return
    // A response already under way on this socket cannot be followed by another.
    const inFlight = (socket as Socket & { _httpMessage?: ServerResponse | null })._httpMessage ?? undefined
    if (!socket.writable || inFlight?.headersSent === true) {
      socket.destroy()
      return
    }
    // A pipelined later request's error: the answers owed go first (as nginx does), then this one, once. Answering
    // it at once would take the place of an answer the engine is still making (a create told it failed).
    if ((socket as DeferringSocket)[kDeferred] === true) return
    const owed = lastOwedResponse(socket)
    if (owed !== undefined && owed.req.complete) {
      ;(socket as DeferringSocket)[kDeferred] = true
      owed.shouldKeepAlive = false
      owed.once('prefinish', () => {
        if (socket.writable) socket.write(rawAnswer(err.code, refused))
      })
      return
    }
    // A request in the framework whose body was cut short: this answer is its answer.
    let requestId = newRequestId()
    if (inFlight === undefined) socket.write(rawAnswer(err.code, refused, requestId))
    else {
      requestId = cutByServer(inFlight, answerTo(err.code)[0]) ?? requestId
      // A reset mid-body looks like a half-close until this write fails: that client left after all.
      socket.write(rawAnswer(err.code, refused, requestId), (writeErr) => {
        if (writeErr != null) cutByServer(inFlight, undefined)
        // A body still arriving would go on to its handler and the engine: the connection ends, never lingers.
        else if (!inFlight.req.complete) socket.destroy()
      })
      if (!inFlight.req.complete) return
    }
    lingerAfterRawAnswer(socket, lingers.limits.bodyFactor * CREATE_BODY_MAX_BYTES, lingers, requestId)
  }
}
