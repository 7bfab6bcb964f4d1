import { randomFillSync } from 'node:crypto'

/** Pooled, to spare the request path a crypto call per id; each CSPRNG byte is handed out once. */
const pool = Buffer.allocUnsafe(16 * 1024)
let offset = pool.length

/** At most the pool's size. */
export function randomHex (bytes: number): string {
  if (offset + bytes > pool.length) {
    randomFillSync(pool)
    offset = 0
  }
  const hex = pool.toString('hex', offset, offset + bytes)
  offset += bytes
  return hex
}
