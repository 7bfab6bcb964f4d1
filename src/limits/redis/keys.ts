/**
 * Key names in Redis (DECISIONS 26): every key carries its user in a hash tag,
 * `pgw:rl:{alice}:29512345`, `pgw:idem:{alice}:<key>` and `pgw:up:{alice}`, so one user's
 * counters and records live in one Redis Cluster slot, and an operator finds
 * them with `redis-cli --scan --pattern '*{alice}*'`.
 *
 * Redis hashes the text between the first `{` and the first `}` after it
 * (Redis Cluster spec, "Hash tags"). A subject holding `}` would end the tag
 * early and `%`, `{`, `}` are percent-encoded, so the tag is always the whole
 * (escaped) subject and nothing in a token can move a key to another slot.
 */

const PREFIX = 'pgw:'

/** The subject as it appears between the braces: as it is unless it holds `%`, `{` or `}`. */
export function escapeSubject (subject: string): string {
  // '' would make an empty tag, which Redis ignores (the whole key is hashed):
  // '%' alone never comes out of the escaping below, so it cannot collide.
  if (subject === '') return '%'
  return /[%{}]/.test(subject) ? subject.replace(/[%{}]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`) : subject
}

/** The hash tag of a subject's keys, braces included. */
export function hashTag (subject: string): string {
  return `{${escapeSubject(subject)}}`
}

/** The counter of `subject`'s fixed window number `windowId`. */
export function windowKey (subject: string, windowId: number): string {
  return `${PREFIX}rl:${hashTag(subject)}:${windowId}`
}

/** The record of `subject`'s Idempotency-Key `key`. */
export function recordKey (subject: string, key: string): string {
  return `${PREFIX}idem:${hashTag(subject)}:${key}`
}

/** `subject`'s uploads in progress: a sorted set of lease ids scored by their expiry (DECISIONS 23). */
export function uploadsKey (subject: string): string {
  return `${PREFIX}up:${hashTag(subject)}`
}

/**
 * A short-lived key the replication acknowledgement writes before its WAIT,
 * in `subject`'s slot, so in a cluster it reaches the master of the record
 * just stored (replication.ts).
 */
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

/** Keys grouped by slot, each group in first-seen order: one script call per group in a cluster. */
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
