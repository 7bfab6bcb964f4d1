/**
 * The base58 length check behind the Solana address format (schemas/formats.ts),
 * against a plain BigInt decoder on random and edge-case inputs.
 */
import { randomInt } from 'node:crypto'
import t from 'tap'
import { base58DecodedLength, isSolanaAddress } from '../../schemas/formats.js'
import { MINTS } from '../helpers/app.js'

const ALPHABET = '123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz'

/** The reference: the value as a BigInt, its byte length, plus one zero byte per leading '1'. */
function referenceLength (text: string): number {
  let value = 0n
  for (const char of text) {
    const digit = ALPHABET.indexOf(char)
    if (digit < 0) return -1
    value = value * 58n + BigInt(digit)
  }
  const zeros = /^1*/.exec(text)![0].length
  return zeros + (value === 0n ? 0 : Math.ceil(value.toString(2).length / 8))
}

t.test('decoded length matches a BigInt decoder', async (t) => {
  const cases = [
    '', '1', '11', '2', 'z', '21', '1112', '5Q', '5R', 'LUw', 'LUv', '1LUw', '2NEpo7TZRRrLZSi2U', 'zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz',
    '0OIl', 'abc0', 'é', ...MINTS
  ]
  for (let i = 0; i < 2000; i++) {
    const length = randomInt(1, 61)
    const ones = randomInt(0, 4)
    let text = '1'.repeat(Math.min(ones, length))
    while (text.length < length) text += ALPHABET[randomInt(0, 58)]
    cases.push(text)
  }
  const wrong = cases.filter((text) => base58DecodedLength(text) !== referenceLength(text))
  t.same(wrong, [], `${cases.length} inputs`)
  for (const mint of MINTS) t.ok(isSolanaAddress(mint), `${mint} is a 32-byte key`)
  t.ok(isSolanaAddress('1'.repeat(32)), "32 ones: the system program's 32 zero bytes")
  t.notOk(isSolanaAddress('z'.repeat(44)), '44 z: more than 32 bytes')
  t.ok(isSolanaAddress('1'.repeat(31) + '2'), '31 zero bytes and a 1: 32 bytes')
  t.notOk(isSolanaAddress('1'.repeat(32) + '2'), '33 bytes')
})
