/** Formats JSON Schema does not know, registered with both Ajv and TypeBox so every validator agrees. */
import { FormatRegistry } from '@sinclair/typebox'

const BASE58_ALPHABET = '123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz'
const BASE58_VALUE = new Int8Array(128).fill(-1)
for (let i = 0; i < BASE58_ALPHABET.length; i++) BASE58_VALUE[BASE58_ALPHABET.charCodeAt(i)] = i

/**
 * -1 when `text` is not base58 (Bitcoin alphabet). Built in 24-bit limbs, where 58 * limb + carry stays below 2^30
 * so bit operations are exact.
 */
export function base58DecodedLength (text: string): number {
  const limbs: number[] = []
  let zeros = 0
  while (zeros < text.length && text.charCodeAt(zeros) === 49 /* '1' */) zeros++
  for (let i = zeros; i < text.length; i++) {
    const code = text.charCodeAt(i)
    const digit = code < 128 ? BASE58_VALUE[code]! : -1
    if (digit < 0) return -1
    let carry = digit
    for (let j = 0; j < limbs.length; j++) {
      carry += limbs[j]! * 58
      limbs[j] = carry & 0xffffff
      carry >>>= 24
    }
    while (carry > 0) {
      limbs.push(carry & 0xffffff)
      carry >>>= 24
    }
  }
  if (limbs.length === 0) return zeros
  const bits = (limbs.length - 1) * 24 + 32 - Math.clz32(limbs[limbs.length - 1]!)
  return zeros + Math.ceil(bits / 8)
}

/** A Solana public key decodes to exactly 32 bytes (decision: addresses). */
export function isSolanaAddress (text: string): boolean {
  // 32 bytes encode to 32..44 base58 characters; checking length first bounds the work.
  return text.length >= 32 && text.length <= 44 && base58DecodedLength(text) === 32
}

export const SOLANA_ADDRESS_FORMAT = 'solana-address'

FormatRegistry.Set(SOLANA_ADDRESS_FORMAT, isSolanaAddress)

type StringFormat = { type: 'string', validate: (s: string) => boolean }

export function ajvFormats<T extends { addFormat: (name: string, format: StringFormat) => unknown }> (ajv: T): T {
  ajv.addFormat(SOLANA_ADDRESS_FORMAT, { type: 'string', validate: isSolanaAddress })
  return ajv
}
