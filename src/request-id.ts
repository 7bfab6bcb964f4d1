/** Request ids (DECISIONS 10): the client's when sane, ours otherwise. */
import { randomUUID } from 'node:crypto'
import type { IncomingMessage } from 'node:http'

/** Short and printable: safe to log, to echo, and to send to the engine as a header. */
const SANE_REQUEST_ID = /^[\x21-\x7e]{1,128}$/

export function requestIdFrom (req: IncomingMessage): string {
  const given = req.headers['x-request-id']
  return typeof given === 'string' && SANE_REQUEST_ID.test(given) ? given : randomUUID()
}
