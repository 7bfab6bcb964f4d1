/**
 * Answers that Node's HTTP parser gives before any route runs (DECISIONS 21):
 * 431 headers too large, 408 request timeout, 400 malformed request. Fastify's
 * default writes its own body shape, no request id, and closes the socket
 * without saying so, so a client that pipelined its next request loses it.
 * Here: the simple shape, a request id, and `connection: close` before the
 * socket is ended; then the socket lingers (connection-close.ts), so a client
 * still sending reads the answer instead of a reset.
 *
 * Some of these come while a request is already in the framework, its body
 * still arriving: the request timeout, or a client that half-closes mid-body.
 * That request's response is then never sent; the raw answer is its answer.
 * So it carries that request's id, and the request's access line shows the
 * status sent instead of a client that left (client-gone.ts cutByServer).
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

/**
 * Fastify's `clientErrorHandler`. A reset or destroyed socket has nobody to
 * answer. The route is unknown (the parser could not read the request), so the
 * linger allows as much as the route with the largest body would.
 */
export type ParserRefused = (status: number, code: string | undefined, requestId: string) => void

/** The raw answer, told to `refused` (the log line these answers get, since no access line is written for them). */
function rawAnswer (
  code: string | undefined,
  refused: ParserRefused | undefined,
  requestId: string = newRequestId()
): string {
  refused?.(answerTo(code)[0], code, requestId)
  return clientErrorAnswer(code, requestId)
}

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
    // Every request read so far was read whole: the error is a later request's (a bad line or headers
    // pipelined behind them). Those requests are answered first, the last with `connection: close`,
    // then this answer goes out before the connection ends, as nginx does. Answered now, it would take
    // the place of an answer the engine is still making (a create the client would be told failed).
    // A parser in error reports every further chunk as another error: one answer, the first error's.
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
      // Node reads a reset as the end of the input, so a client that reset mid-body looks like one
      // that half-closed: the answer it cannot take shows which it was (the write fails before the
      // socket closes), and that client left after all.
      socket.write(rawAnswer(err.code, refused, requestId), (writeErr) => {
        if (writeErr != null) cutByServer(inFlight, undefined)
        // A body still arriving would go on to its handler (a create streaming to the engine, which would
        // complete what the client was told failed): the connection ends with its answer, never lingers.
        else if (!inFlight.req.complete) socket.destroy()
      })
      if (!inFlight.req.complete) return
    }
    lingerAfterRawAnswer(socket, lingers.limits.bodyFactor * CREATE_BODY_MAX_BYTES, lingers, requestId)
  }
}
