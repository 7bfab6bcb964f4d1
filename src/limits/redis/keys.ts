/**
 * Every key carries its user in a hash tag (`pgw:rl:{alice}:29512345`), so one user's keys share a cluster slot
 * (decision: redis with more than one node).
 */

const PREFIX = 'pgw:'

/** `%`, `{` and `}` are percent-encoded, since a `}` would end the tag early and move the key to another slot. */
export function escapeSubject (subject: string): string {
  // Redis ignores an empty tag; '%' alone never comes out of the escaping, so it cannot collide.
  if (subject === '') return '%'
  return subject.replace(/[%{}]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`)
}

export function hashTag (subject: string): string {
  return `{${escapeSubject(subject)}}`
}

export function windowKey (subject: string, windowId: number): string {
  return `${PREFIX}rl:${hashTag(subject)}:${windowId}`
}

export function recordKey (subject: string, key: string): string {
  return `${PREFIX}idem:${hashTag(subject)}:${key}`
}

/** A sorted set of lease ids scored by their expiry. */
export function uploadsKey (subject: string): string {
  return `${PREFIX}up:${hashTag(subject)}`
}

/** Written before a WAIT, in the record's slot, so in a cluster it reaches the record's master. */
export function ackKey (subject: string): string {
  return `${PREFIX}ack:${hashTag(subject)}`
}

/** CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with. */
const CRC_TABLE = (() => {
  const table = new Uint16Array(256)
  for (let i = 0; i < 256; i++) {
    let crc = i << 8
    for (let bit = 0; bit < 8; bit++) crc = (crc & 0x8000) !== 0 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff
    table[i] = crc
  }
  return table
})()

function crc16 (bytes: Uint8Array): number {
  let crc = 0
  for (const byte of bytes) crc = ((crc << 8) & 0xffff) ^ CRC_TABLE[((crc >> 8) ^ byte) & 0xff]!
  return crc
}

/** The cluster slot of a key (0-16383), hash tags honoured as Redis does. */
export function keySlot (key: string): number {
  const bytes = Buffer.from(key, 'utf8')
  const open = bytes.indexOf(0x7b)
  if (open !== -1) {
    const close = bytes.indexOf(0x7d, open + 1)
    if (close > open + 1) return crc16(bytes.subarray(open + 1, close)) % 16384
  }
  return crc16(bytes) % 16384
}

export function groupBySlot (keys: readonly string[]): Map<number, string[]> {
  const groups = new Map<number, string[]>()
  for (const key of keys) {
    const slot = keySlot(key)
    const group = groups.get(slot)
    if (group === undefined) groups.set(slot, [key])
    else group.push(key)
  }
  return groups
}
