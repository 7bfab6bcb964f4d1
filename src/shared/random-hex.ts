import { randomFillSync } from 'node:crypto'

/**
 * Random hex strings from a pooled buffer: one randomFillSync per 16 KiB
 * (about 680 requests' trace and span ids) instead of a crypto call per id on
 * the request path. The bytes are the CSPRNG's, each handed out once.
 */
const pool = Buffer.allocUnsafe(16 * 1024)
let offset = pool.length

/** `bytes` random bytes as 2 × `bytes` lowercase hex characters (at most the pool's size). */
export function randomHex (bytes: number): string {
  if (offset + bytes > pool.length) {
    randomFillSync(pool)
    offset = 0
  }
  const hex = pool.toString('hex', offset, offset + bytes)
  offset += bytes
  return hex
}
