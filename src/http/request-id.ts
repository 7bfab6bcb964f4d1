/** Request ids (DECISIONS 10): the client's when sane, ours otherwise. */
import type { IncomingMessage } from 'node:http'
import { REQUEST_ID_HEADER } from '../../schemas/upstream.js'
import { randomHex } from '../shared/random-hex.js'

/** Short and printable: safe to log, to echo, and to send to the engine as a header. */
const SANE_REQUEST_ID = /^[\x21-\x7e]{1,128}$/

/**
 * Our ids are random UUIDs (version 4, what clients and log tools expect of a
 * request id), from the pooled random bytes the trace ids use: a few hundred
 * nanoseconds, where `randomUUID()` showed in profiles. Not a counter: ids go
 * back to clients, and consecutive ones would tell a client how many requests
 * an instance served between two of its own, and which instance it reached.
 */
export function newRequestId (): string {
  const hex = randomHex(16)
  // Version 4 in the 13th digit, the variant (10xx) in the 17th.
  const variant = ((parseInt(hex[16]!, 16) & 0x3) | 0x8).toString(16)
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-4${hex.slice(13, 16)}-${variant}${hex.slice(17, 20)}-${hex.slice(20, 32)}`
}

export function requestIdFrom (req: IncomingMessage): string {
  const given = req.headers[REQUEST_ID_HEADER]
  return typeof given === 'string' && SANE_REQUEST_ID.test(given) ? given : newRequestId()
}
