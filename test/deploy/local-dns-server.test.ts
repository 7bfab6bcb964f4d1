/**
 * deploy/local/dns.ts, the topology's tiny DNS server, asked over real UDP by
 * Node's own resolver (c-ares) and by a raw socket for the bytes themselves.
 */
import { createSocket } from 'node:dgram'
import { once } from 'node:events'
import { Resolver } from 'node:dns/promises'
import t, { type Test } from 'tap'
import { startDnsServer, UDP_ANSWER_MAX_BYTES, type DnsServer } from '../../deploy/local/dns.js'

async function server (t: Test): Promise<DnsServer> {
  const s = await startDnsServer()
  t.teardown(s.close)
  return s
}

function resolverOf (s: DnsServer): Resolver {
  // One try with a short timeout: a server that does not answer fails the test at once instead of retrying.
  const r = new Resolver({ timeout: 2_000, tries: 1 })
  r.setServers([s.address])
  return r
}

const codeOf = async (p: Promise<unknown>): Promise<string | undefined> =>
  await p.then(
    () => undefined,
    (err: NodeJS.ErrnoException) => err.code
  )

/** One query over a raw UDP socket: `id`, name, type; the answer's bytes. */
async function rawQuery (s: DnsServer, bytes: Buffer): Promise<Buffer> {
  const socket = createSocket('udp4')
  try {
    socket.send(bytes, s.port, s.host)
    const [msg] = (await once(socket, 'message')) as [Buffer]
    return msg
  } finally {
    socket.close()
  }
}

function query (id: number, name: string, type: number, flags = 0x0100): Buffer {
  const labels = name.split('.').map((l) => Buffer.concat([Buffer.from([l.length]), Buffer.from(l, 'latin1')]))
  const h = Buffer.alloc(12)
  h.writeUInt16BE(id, 0)
  h.writeUInt16BE(flags, 2)
  h.writeUInt16BE(1, 4)
  const tail = Buffer.alloc(4)
  tail.writeUInt16BE(type, 0)
  tail.writeUInt16BE(1, 2)
  return Buffer.concat([h, ...labels, Buffer.from([0]), tail])
}

t.test('A and AAAA from the table, each family on its own, changed at run time', async (t) => {
  const s = await server(t)
  const r = resolverOf(s)
  s.set('engines.local', ['127.0.0.3', '127.0.0.2', '::1', 'fd00::a:2'])
  t.same((await r.resolve4('engines.local')).sort(), ['127.0.0.2', '127.0.0.3'])
  t.same((await r.resolve6('engines.local')).sort(), ['::1', 'fd00::a:2'])
  t.same(
    await r.resolve4('engines.local', { ttl: true }),
    [
      { address: '127.0.0.3', ttl: 0 },
      { address: '127.0.0.2', ttl: 0 }
    ],
    'TTL 0: never kept by a resolver'
  )

  s.set('engines.local', ['127.0.0.4'])
  t.same(await r.resolve4('engines.local'), ['127.0.0.4'], 'the next query sees the change')
  t.equal(await codeOf(r.resolve6('engines.local')), 'ENODATA', 'no IPv6 address left: NOERROR with no answer')
  t.same(await r.resolve4('ENGINES.Local'), ['127.0.0.4'], 'names compare without case')
  t.ok(s.queries('engines.local') >= 6, 'the queries are counted per name')
})

t.test('an unknown or removed name is NXDOMAIN, a known name with no address NODATA', async (t) => {
  const s = await server(t)
  const r = resolverOf(s)
  t.equal(await codeOf(r.resolve4('nobody.local')), 'ENOTFOUND')
  s.set('empty.local', [])
  t.equal(await codeOf(r.resolve4('empty.local')), 'ENODATA')
  s.set('gone.local', ['127.0.0.2'])
  s.remove('gone.local')
  t.equal(await codeOf(r.resolve4('gone.local')), 'ENOTFOUND')
  t.throws(() => {
    s.set('bad.local', ['engine-1'])
  }, /engine-1 is not an IP address/)
})

t.test(
  'the answer echoes the ID, opcode, RD and the question as sent, and points its records at the question name',
  async (t) => {
    const s = await server(t)
    s.set('engines.local', ['127.0.0.2', '127.0.0.3'])
    const q = query(0xbeef, 'EnGines.local', 1)
    const a = await rawQuery(s, q)
    t.equal(a.readUInt16BE(0), 0xbeef, 'ID')
    t.equal(a[2], 0x85, 'QR, opcode QUERY, AA, RD as asked')
    t.equal(a[3], 0, 'RA 0, NOERROR')
    t.same(
      [a.readUInt16BE(4), a.readUInt16BE(6), a.readUInt16BE(8), a.readUInt16BE(10)],
      [1, 2, 0, 0],
      'one question, two answers'
    )
    const questionEnd = q.length
    t.same(a.subarray(12, questionEnd), q.subarray(12), 'the question byte for byte, case included')
    const first = a.subarray(questionEnd, questionEnd + 16)
    t.same(
      [...first],
      [0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4, 127, 0, 0, 2],
      'name pointer 0xC00C, A, IN, TTL 0, 4 bytes of address'
    )
    t.equal(a.length, questionEnd + 32, 'nothing after the two records')

    const six = await rawQuery(s, query(7, 'nobody.local', 28, 0))
    t.equal(six.readUInt16BE(0), 7)
    t.equal(six[2], 0x84, 'RD 0 echoed')
    t.equal(six[3], 3, 'NXDOMAIN')
    t.same([six.readUInt16BE(4), six.readUInt16BE(6)], [1, 0], 'the question, no answer, no SOA (nothing cached)')
  }
)

t.test('a malformed query gets FORMERR, another opcode NOTIMP, a response nothing', async (t) => {
  const s = await server(t)
  const truncated = query(9, 'engines.local', 1).subarray(0, 20)
  const formErr = await rawQuery(s, truncated)
  t.same([formErr.readUInt16BE(0), formErr[3], formErr.length], [9, 1, 12], 'FORMERR, header only')
  const status = await rawQuery(s, query(10, 'engines.local', 1, 0x1000)) // opcode 2, STATUS
  t.same([status.readUInt16BE(0), status[2]! & 0x78, status[3]], [10, 0x10, 4], 'NOTIMP, opcode echoed')
  // A datagram with QR set is a response: answering it could start a loop between two servers. The next
  // query is answered, so the response got nothing (answers on one socket come in order).
  const socket = createSocket('udp4')
  t.teardown(() => socket.close())
  const got: Buffer[] = []
  socket.on('message', (m) => got.push(m))
  socket.send(query(11, 'engines.local', 1, 0x8100), s.port, s.host)
  socket.send(query(12, 'engines.local', 1), s.port, s.host)
  await once(socket, 'message')
  t.same(
    got.map((m) => m.readUInt16BE(0)),
    [12],
    'only the query was answered'
  )
})

t.test(
  'an answer that would not fit in a 512-byte UDP answer is refused by set(), so none is ever sent truncated',
  async (t) => {
    const s = await server(t)
    const r = resolverOf(s)
    const v4 = (n: number): string[] => Array.from({ length: n }, (_, i) => `10.0.${i >> 8}.${i & 255}`)
    const v6 = (n: number): string[] => Array.from({ length: n }, (_, i) => `fd00::${(i + 1).toString(16)}`)
    // engines.local: a 12-byte header, a 19-byte question (15 for the name), 16 bytes per A record, 28 per AAAA.
    s.set('engines.local', [...v4(30), ...v6(17)])
    const a = await rawQuery(s, query(1, 'engines.local', 1))
    t.same(
      [a.readUInt16BE(6), a.length, a[2]! & 0x02],
      [30, 12 + 19 + 30 * 16, 0],
      '30 A records in 511 bytes, TC clear'
    )
    const aaaa = await rawQuery(s, query(2, 'engines.local', 28))
    t.same(
      [aaaa.readUInt16BE(6), aaaa.length, aaaa[2]! & 0x02],
      [17, 12 + 19 + 17 * 28, 0],
      '17 AAAA records in 507 bytes, TC clear'
    )
    t.ok(a.length <= UDP_ANSWER_MAX_BYTES && aaaa.length <= UDP_ANSWER_MAX_BYTES)
    t.equal((await r.resolve4('engines.local')).length, 30, 'c-ares reads the largest answer whole')

    t.throws(() => {
      s.set('engines.local', v4(31))
    }, new Error('engines.local: 31 IPv4 addresses make a 527-byte answer, over the 512 bytes of a UDP answer (RFC 1035; this server has no TCP): at most 30 IPv4 addresses for this name'))
    t.throws(() => {
      s.set('Engines.Local.', [...v4(2), ...v6(18)])
    }, new Error('engines.local: 18 IPv6 addresses make a 535-byte answer, over the 512 bytes of a UDP answer (RFC 1035; this server has no TCP): at most 17 IPv6 addresses for this name'))
    t.equal(s.get('engines.local')?.length, 47, 'a refused set() changes nothing')
    const long = `${'a'.repeat(63)}.${'b'.repeat(63)}.local`
    t.throws(
      () => {
        s.set(long, v4(25))
      },
      /: 25 IPv4 addresses make a 551-byte answer, .* at most 22 IPv4 addresses for this name$/,
      'a longer name leaves room for fewer'
    )
  }
)
