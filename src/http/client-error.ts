/**
 * Answers that Node's HTTP parser gives before any route runs (DECISIONS 21):
 * 431 headers too large, 408 request timeout, 400 malformed request. Fastify's
 * default writes its own body shape, no request id, and closes the socket
 * without saying so, so a client that pipelined its next request loses it
 * (issue 7 item 11). Here: the simple shape, a fresh request id, and
 * `connection: close` before the socket is ended.
 */
import { randomUUID } from 'node:crypto'
import { STATUS_CODES } from 'node:http'
import type { Socket } from 'node:net'
import { REQUEST_ID_HEADER } from '../../schemas/upstream.js'

const ANSWERS: Readonly<Record<string, readonly [number, string]>> = {
  HPE_HEADER_OVERFLOW: [431, 'request headers too large'],
  ERR_HTTP_REQUEST_TIMEOUT: [408, 'request timed out'],
  HPE_HEADERS_TIMEOUT: [408, 'request timed out']
}
const MALFORMED: readonly [number, string] = [400, 'malformed HTTP request']

/** The raw HTTP answer for a parser error: simple shape, an id, and the socket's end said out loud. */
export function clientErrorAnswer (code: string | undefined, requestId: string = randomUUID()): string {
  const [status, message] = (code === undefined ? undefined : ANSWERS[code]) ?? MALFORMED
  const body = JSON.stringify({ error: message })
  return `HTTP/1.1 ${status} ${STATUS_CODES[status]!}\r\n` +
    'content-type: application/json; charset=utf-8\r\n' +
    `content-length: ${Buffer.byteLength(body)}\r\n` +
    `${REQUEST_ID_HEADER}: ${requestId}\r\n` +
    'connection: close\r\n\r\n' + body
}

/** Fastify's `clientErrorHandler`. A reset or destroyed socket has nobody to answer. */
export function answerClientError (err: NodeJS.ErrnoException, socket: Socket): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return
  // A response already under way on this socket cannot be followed by another.
  const busy = (socket as Socket & { _httpMessage?: { headersSent?: boolean } })._httpMessage?.headersSent === true
  if (!socket.writable || busy) {
    socket.destroy()
    return
  }
  // end, not destroy: a reset could reach the client before the answer it must read.
  socket.end(clientErrorAnswer(err.code))
  setTimeout(() => socket.destroy(), 1_000).unref()
}
