/** Request ids (DECISIONS 10): the client's when sane, ours otherwise. */
import { randomBytes } from 'node:crypto'
import type { IncomingMessage } from 'node:http'
import { REQUEST_ID_HEADER } from '../../schemas/upstream.js'

/** Short and printable: safe to log, to echo, and to send to the engine as a header. */
const SANE_REQUEST_ID = /^[\x21-\x7e]{1,128}$/

/**
 * Our ids are shaped like a UUID (8-4-4-4-12 hex digits, what clients and
 * log tools expect of a request id) but cost a counter increment: 80 random
 * bits drawn once per process, then a 48-bit counter that starts at a random
 * value (so an id does not tell how many requests this process has served).
 * Unique per process until 2^48 requests; across processes the prefix makes
 * a collision as unlikely as a random UUID's.
 */
const PREFIX = ((hex: string) => `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-`)(randomBytes(10).toString('hex'))
const COUNTER_SPAN = 2 ** 48
let counter = randomBytes(6).readUIntBE(0, 6)

export function newRequestId (): string {
  counter = (counter + 1) % COUNTER_SPAN
  return PREFIX + counter.toString(16).padStart(12, '0')
}

export function requestIdFrom (req: IncomingMessage): string {
  const given = req.headers[REQUEST_ID_HEADER]
  return typeof given === 'string' && SANE_REQUEST_ID.test(given) ? given : newRequestId()
}
