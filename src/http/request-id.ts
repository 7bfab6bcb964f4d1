/** Request ids: the client's when sane, ours otherwise (decision: request ids). */
import { randomUUID } from 'node:crypto'
import type { IncomingMessage } from 'node:http'
import { REQUEST_ID_HEADER } from '../../schemas/upstream.js'

/** Short and printable: safe to log, to echo, and to send to the engine as a header. */
const SANE_REQUEST_ID = /^[\x21-\x7e]{1,128}$/

/** Random, not a counter: consecutive ids would tell a client how busy an instance is, and which one it reached. */
export function newRequestId (): string {
  return randomUUID()
}

export function requestIdFrom (req: IncomingMessage): string {
  const given = req.headers[REQUEST_ID_HEADER]
  return typeof given === 'string' && SANE_REQUEST_ID.test(given) ? given : newRequestId()
}
