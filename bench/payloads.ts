/**
 * Request bodies and tokens for the load test. Everything is built once, in
 * memory, before any load runs: the load generator must only write buffers.
 */
import { createHmac, randomBytes } from 'node:crypto'
import { crc32, deflateSync } from 'node:zlib'
import { isSolanaAddress } from '../schemas/formats.js'

const b64url = (data: string | Buffer): string => Buffer.from(data).toString('base64url')

/** An HS256 JWT as the gateway expects one (DECISIONS 9: `sub` becomes x-user-id). */
export function mintToken (secret: string, sub = 'bench-user', lifetimeSeconds = 3600): string {
  const now = Math.floor(Date.now() / 1000)
  const head = b64url(JSON.stringify({ alg: 'HS256', typ: 'JWT' }))
  const payload = b64url(JSON.stringify({ sub, iat: now, exp: now + lifetimeSeconds }))
  const signature = createHmac('sha256', secret).update(`${head}.${payload}`).digest('base64url')
  return `${head}.${payload}.${signature}`
}

/** A random HS256 secret, well over the 32 characters the gateway requires. */
export function randomSecret (): string {
  return randomBytes(36).toString('base64url')
}

/** Real mainnet mints (wSOL, USDC, USDT, BONK, JUP): base58 that decodes to 32 bytes. */
export const MINTS = [
  'So11111111111111111111111111111111111111112',
  'EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v',
  'Es9vMFrzaCERmJfrF4H2FYD4KCoNkY11McCe8BenwNYB',
  'DezXAZ8z7PnrnRJjz3wXBoRgixCa6xjnB7YaB1pPB263',
  'JUPyiwrYJFskUPiHa7hkeR8VUtAeFoSYbKedZNsDvCN'
] as const

// Checked with the gateway's own validator, so a typo fails here, loudly,
// instead of showing up as a column of 400s in the results.
for (const mint of MINTS) {
  if (!isSolanaAddress(mint)) throw new Error(`bench fixture mint ${mint} is not a Solana address`)
}

/** A valid update: five positions of 0.2 (their float sum is exactly 1). */
export function updateBody (portfolioId: string): string {
  return JSON.stringify({
    portfolio_id: portfolioId,
    target_positions: MINTS.map((mint) => ({ mint, allocation: 0.2 }))
  })
}

function pngChunk (type: string, data: Buffer): Buffer {
  const head = Buffer.alloc(8)
  head.writeUInt32BE(data.length, 0)
  head.write(type, 4, 'latin1')
  const crc = Buffer.alloc(4)
  crc.writeUInt32BE(crc32(data, crc32(head.subarray(4))) >>> 0, 0)
  return Buffer.concat([head, data, crc])
}

const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])

/**
 * A well-formed 1x1 RGB PNG of exactly `size` bytes (at least 69). Bulk comes
 * from a private ancillary chunk ("bnCh": decoders skip it) of random bytes,
 * which, like real image data, does not compress.
 */
export function pngImage (size: number): Buffer {
  const ihdr = Buffer.alloc(13)
  ihdr.writeUInt32BE(1, 0) // width
  ihdr.writeUInt32BE(1, 4) // height
  ihdr[8] = 8 // bit depth
  ihdr[9] = 2 // colour type: RGB
  const parts = [
    PNG_SIGNATURE,
    pngChunk('IHDR', ihdr),
    pngChunk('IDAT', deflateSync(Buffer.from([0, 0x2a, 0x7f, 0xd4]))) // filter byte + one pixel
  ]
  const iend = pngChunk('IEND', Buffer.alloc(0))
  const used = parts.reduce((n, p) => n + p.length, 0) + iend.length
  const filler = size - used - 12 // a chunk adds 12 bytes around its data
  if (filler < 0) throw new Error(`a PNG needs at least ${used + 12} bytes`)
  parts.push(pngChunk('bnCh', randomBytes(filler)), iend)
  return Buffer.concat(parts)
}

export interface Multipart {
  body: Buffer
  contentType: string
}

/** The create form (spec: name, type, optional image) as one multipart/form-data body. */
export function createForm (image: Buffer): Multipart {
  const boundary = `----bench${randomBytes(12).toString('hex')}`
  const field = (name: string, value: string): string =>
    `--${boundary}\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n${value}\r\n`
  const head = field('name', 'Bench portfolio') + field('type', 'PORTFOLIO') +
    `--${boundary}\r\nContent-Disposition: form-data; name="image"; filename="bench.png"\r\nContent-Type: image/png\r\n\r\n`
  return {
    body: Buffer.concat([Buffer.from(head), image, Buffer.from(`\r\n--${boundary}--\r\n`)]),
    contentType: `multipart/form-data; boundary=${boundary}`
  }
}
