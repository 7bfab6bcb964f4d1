/**
 * A tiny authoritative DNS server over UDP (RFC 1035), for the local topology
 * and the tests: the gateways' UPSTREAM_DNS_SERVERS points at it, and the
 * caller changes a name's addresses at run time, as a Kubernetes headless
 * Service's endpoints change in a rollout.
 *
 * It answers one question per query: A and AAAA from its table (TTL 0, so no
 * resolver keeps an answer; Node's own Resolver keeps none in any case),
 * NOERROR with no answer for another type of a known name or a name with no
 * address of that family (NODATA, RFC 2308), NXDOMAIN for an unknown name,
 * FORMERR for a query it cannot parse, NOTIMP for an opcode other than QUERY.
 * No SOA goes with a negative answer, so none is cached (RFC 2308, section 5).
 * The additional section (EDNS's OPT record) is ignored, so an answer must
 * fit in 512 bytes (RFC 1035, 4.2.1), and there is no TCP to retry over after
 * a truncated one: set() refuses a name whose A or AAAA answer would not fit
 * (about 30 IPv4 or 17 IPv6 addresses for a short name), with an error that
 * says how many do. Nothing is ever sent truncated, and TC is never set.
 */
import { createSocket, type Socket } from 'node:dgram'
import { once } from 'node:events'
import { isIP } from 'node:net'

const HEADER_BYTES = 12
const TYPE_A = 1
const TYPE_AAAA = 28
const CLASS_IN = 1
const RCODE = { noError: 0, formErr: 1, nxDomain: 3, notImp: 4 } as const
/** The answer's owner name: a pointer (0b11 + offset) to the question's name, which starts right after the header. */
const NAME_POINTER = 0xc000 | HEADER_BYTES

export interface DnsServer {
  host: string
  port: number
  /** `host:port`, as UPSTREAM_DNS_SERVERS takes it. */
  address: string
  /**
   * The name's addresses from now on (IPv4 and IPv6 mixed); an empty list keeps the name with no address.
   * Throws, changing nothing, when its A or AAAA answer would not fit in UDP_ANSWER_MAX_BYTES.
   */
  set: (name: string, addresses: readonly string[]) => void
  /** Forget the name: NXDOMAIN from now on. */
  remove: (name: string) => void
  /** The addresses now served for a name, undefined when it is unknown. */
  get: (name: string) => readonly string[] | undefined
  /** Queries answered so far for `name` (any type), e.g. to wait for a client's next resolution. */
  queries: (name: string) => number
  close: () => Promise<void>
}

interface Question {
  /** The question as sent (name, type, class), echoed in the answer byte for byte. */
  bytes: Buffer
  /** Lower case, without the root's dot. */
  name: string
  type: number
  class: number
}

/** The question section of `msg` (offset 12), or undefined when it is malformed. */
function parseQuestion (msg: Buffer): Question | undefined {
  let at = HEADER_BYTES
  const labels: string[] = []
  for (;;) {
    if (at >= msg.length) return undefined
    const length = msg[at]!
    at++
    if (length === 0) break
    // A pointer or a reserved label type: a query's question is never compressed.
    if ((length & 0xc0) !== 0 || at + length > msg.length) return undefined
    labels.push(msg.toString('latin1', at, at + length))
    at += length
  }
  if (at + 4 > msg.length) return undefined
  return {
    bytes: msg.subarray(HEADER_BYTES, at + 4),
    name: labels.join('.').toLowerCase(),
    type: msg.readUInt16BE(at),
    class: msg.readUInt16BE(at + 2)
  }
}

/** A header for an answer to `query`: its ID, QR set, its opcode and RD echoed, AA set, `rcode`. */
function header (query: Buffer, rcode: number, questions: number, answers: number): Buffer {
  const h = Buffer.alloc(HEADER_BYTES)
  h.writeUInt16BE(query.readUInt16BE(0), 0)
  const opcodeAndRd = query[2]! & 0x79 // opcode (bits 3-6) and RD (bit 0) of the query's third byte
  h[2] = 0x80 | opcodeAndRd | 0x04 // QR, AA
  h[3] = rcode // RA 0 (no recursion here), Z 0
  h.writeUInt16BE(questions, 4)
  h.writeUInt16BE(answers, 6)
  return h
}

function record (type: number, address: string): Buffer {
  const rdata = type === TYPE_A
    ? Buffer.from(address.split('.').map(Number))
    : ipv6Bytes(address)
  const r = Buffer.alloc(12 + rdata.length)
  r.writeUInt16BE(NAME_POINTER, 0)
  r.writeUInt16BE(type, 2)
  r.writeUInt16BE(CLASS_IN, 4)
  r.writeUInt32BE(0, 6) // TTL 0: never cached
  r.writeUInt16BE(rdata.length, 10)
  rdata.copy(r, 12)
  return r
}

/** The 16 bytes of an IPv6 address (a `::` expanded; an embedded IPv4 tail too). */
function ipv6Bytes (address: string): Buffer {
  let text = address
  const v4 = /(\d+\.\d+\.\d+\.\d+)$/.exec(text)?.[1]
  if (v4 !== undefined) {
    const [a, b, c, d] = v4.split('.').map(Number) as [number, number, number, number]
    text = text.slice(0, -v4.length) + `${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`
  }
  const [head = '', tail] = text.split('::') as [string, string | undefined]
  const left = head === '' ? [] : head.split(':')
  const right = tail === undefined || tail === '' ? [] : tail.split(':')
  const groups = tail === undefined ? left : [...left, ...Array<string>(8 - left.length - right.length).fill('0'), ...right]
  const out = Buffer.alloc(16)
  groups.forEach((g, i) => out.writeUInt16BE(parseInt(g, 16), i * 2))
  return out
}

/** The answer to one datagram, or undefined when it is too short to carry an ID to answer. */
export function answer (query: Buffer, table: ReadonlyMap<string, readonly string[]>): Buffer | undefined {
  if (query.length < HEADER_BYTES) return undefined
  if ((query[2]! & 0x80) !== 0) return undefined // a response, not a query: never answer one
  const opcode = (query[2]! >> 3) & 0x0f
  if (opcode !== 0) return header(query, RCODE.notImp, 0, 0)
  const question = query.readUInt16BE(4) === 1 ? parseQuestion(query) : undefined
  if (question === undefined) return header(query, RCODE.formErr, 0, 0)
  const addresses = table.get(question.name)
  if (addresses === undefined) return Buffer.concat([header(query, RCODE.nxDomain, 1, 0), question.bytes])
  const family = question.class !== CLASS_IN ? 0 : question.type === TYPE_A ? 4 : question.type === TYPE_AAAA ? 6 : 0
  const records = addresses.filter((a) => isIP(a) === family).map((a) => record(question.type, a))
  return Buffer.concat([header(query, RCODE.noError, 1, records.length), question.bytes, ...records])
}

const normalName = (name: string): string => name.toLowerCase().replace(/\.$/, '')

/** The largest answer over UDP without EDNS (RFC 1035, 4.2.1). */
export const UDP_ANSWER_MAX_BYTES = 512
/** One answer record: the name pointer, type, class, TTL and length (12 bytes), then the address. */
const RECORD_BYTES = { 4: 12 + 4, 6: 12 + 16 } as const

/**
 * Why `addresses` cannot be served for `name` in one UDP answer, or undefined
 * when both its A and its AAAA answer fit: header, the question echoed (the
 * name's labels, each with its length byte, the root's 0, type and class),
 * and one record per address of the family asked.
 */
function tooBig (name: string, addresses: readonly string[]): string | undefined {
  const questionBytes = name.split('.').reduce((sum, label) => sum + 1 + label.length, 1) + 4
  const room = UDP_ANSWER_MAX_BYTES - HEADER_BYTES - questionBytes
  for (const family of [4, 6] as const) {
    const count = addresses.filter((a) => isIP(a) === family).length
    const bytes = HEADER_BYTES + questionBytes + count * RECORD_BYTES[family]
    if (bytes > UDP_ANSWER_MAX_BYTES) {
      return `${name}: ${count} IPv${family} addresses make a ${bytes}-byte answer, over the ${UDP_ANSWER_MAX_BYTES} bytes of a UDP answer (RFC 1035; this server has no TCP): at most ${Math.floor(room / RECORD_BYTES[family])} IPv${family} addresses for this name`
    }
  }
  return undefined
}

/** Listen on `host` (127.0.0.1) and `port` (0: a free one). */
export async function startDnsServer (opts: { host?: string, port?: number } = {}): Promise<DnsServer> {
  const host = opts.host ?? '127.0.0.1'
  const table = new Map<string, readonly string[]>()
  const asked = new Map<string, number>()
  const socket: Socket = createSocket(isIP(host) === 6 ? 'udp6' : 'udp4')
  socket.on('message', (msg, peer) => {
    const reply = answer(msg, table)
    if (reply === undefined) return
    const name = parseQuestion(msg)?.name
    if (name !== undefined) asked.set(name, (asked.get(name) ?? 0) + 1)
    socket.send(reply, peer.port, peer.address)
  })
  // A send to a client that has gone (ICMP port unreachable) is not the server's failure.
  socket.on('error', () => {})
  socket.bind(opts.port ?? 0, host)
  await once(socket, 'listening')
  const port = socket.address().port
  return {
    host,
    port,
    address: isIP(host) === 6 ? `[${host}]:${port}` : `${host}:${port}`,
    set: (name, addresses) => {
      const bad = addresses.find((a) => isIP(a) === 0)
      if (bad !== undefined) throw new Error(`${bad} is not an IP address`)
      const big = tooBig(normalName(name), addresses)
      if (big !== undefined) throw new Error(big)
      table.set(normalName(name), [...addresses])
    },
    remove: (name) => { table.delete(normalName(name)) },
    get: (name) => table.get(normalName(name)),
    queries: (name) => asked.get(normalName(name)) ?? 0,
    close: async () => { await new Promise<void>((resolve) => socket.close(() => resolve())) }
  }
}
