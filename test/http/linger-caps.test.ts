/**
 * What reading the rest of refused bodies may cost (docs/decisions/0032-a-refused-upload-is-read-to-its-end.md).
 * Lingering sockets are capped per client address and in total: past a cap the linger with the most time left to
 * its end is cut (an unknown end first, then the newest), among that address's or among those of the addresses
 * holding the most; what they read is thrown away, so memory
 * stays flat; a lingering create holds no per-user place; the metrics and the log show them. Raw sockets from
 * several loopback addresses (127.0.0.0/8), with allowHalfOpen so the server's FIN after its answer does not
 * end their sending.
 */
import { once } from 'node:events'
import type { Server } from 'node:http'
import { connect, type Socket } from 'node:net'
import { Writable } from 'node:stream'
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import t from 'tap'
import { addressKey, Lingers, type LingerCut } from '../../src/http/connection-close.js'
import { startStubUpstream } from '../../fixtures/stub-upstream.js'
import { build, hs256, type Built } from '../helpers/app.js'
import { CREATE_FIELDS, imagePart, multipartBody, pngOfSize } from '../helpers/multipart.js'
import { parseExposition, valueOf } from '../helpers/prometheus.js'
import { viaPython } from '../helpers/write-first.js'

interface Lingering {
  client: Socket
  /** The server's side of the connection. */
  server: Socket
  /** The server ended its side after the answer: the linger has begun. */
  lingering: Promise<unknown>
  text: () => string
}

const MiB = 1024 * 1024
const badTokenHead = (length: number, id = ''): string =>
  'POST /api/portfolio/create HTTP/1.1\r\nhost: x\r\nauthorization: Bearer bad\r\n' +
  (id === '' ? '' : `x-request-id: ${id}\r\n`) +
  `content-type: multipart/form-data; boundary=b\r\ncontent-length: ${length}\r\n\r\n`

/** A refused create from `from` whose body is still coming: it lingers until it ends, stalls, or is cut. */
async function refusedUpload ({ app, url }: Built, from: string, length = 8 * MiB, id = ''): Promise<Lingering> {
  const port = Number(new URL(url).port)
  const since = acceptedSoFar(app.server)
  const client = connect({ port, host: '127.0.0.1', localAddress: from, allowHalfOpen: true })
  client.on('error', () => {}) // a cut socket is reset: that is what is tested
  await once(client, 'connect')
  const server = await serverSideOf(app.server, client, since)
  let text = ''
  client.setEncoding('latin1').on('data', (c: string) => { text += c })
  const lingering = once(client, 'end')
  client.write(badTokenHead(length, id) + 'x'.repeat(1024))
  await lingering
  return { client, server, lingering, text: () => text }
}

/**
 * The server's socket for `client`, which connected once `since` sockets had been accepted (acceptedSoFar before
 * its connect()): of those accepted after them, the one from the client's address and port. Sockets accepted
 * earlier are not looked at: a port closed in an earlier round is given to a new client again, and the old
 * server socket of that port (its bytesRead, its close long past) would stand in for the new one.
 */
async function serverSideOf (listener: Server, client: Socket, since: number): Promise<Socket> {
  const mine = (socket: Socket): boolean =>
    socket.remotePort === client.localPort && socket.remoteAddress === client.localAddress
  const known = seen.get(listener)?.slice(since).find(mine)
  if (known !== undefined) return known
  return await new Promise((resolve) => {
    const look = (socket: Socket): void => { if (mine(socket)) { listener.off('connection', look); resolve(socket) } }
    listener.on('connection', look)
  })
}

/** Every socket each gateway accepted, from its start: a connection may be accepted before its client's 'connect'. */
const seen = new WeakMap<Server, Socket[]>()
function recordConnections (built: Built): Built {
  const list: Socket[] = []
  seen.set(built.app.server, list)
  built.app.server.on('connection', (socket: Socket) => list.push(socket))
  return built
}

/** How many sockets `listener` has accepted so far (recordConnections). */
const acceptedSoFar = (listener: Server): number => seen.get(listener)?.length ?? 0

const closed = (s: Lingering): boolean => s.server.destroyed
const serverClosed = async (s: Lingering): Promise<void> => { if (!s.server.closed) await once(s.server, 'close') }

t.test('past the per-address cap a linger of that address is cut (none sent more: the newest); others keep theirs', async (t) => {
  const built = recordConnections(await build(t, { env: { LINGER_MAX_SOCKETS: '8', LINGER_MAX_PER_ADDRESS: '2' } }))
  const other = await refusedUpload(built, '127.0.0.3')
  const first = await refusedUpload(built, '127.0.0.2')
  const second = await refusedUpload(built, '127.0.0.2')
  t.same([first, second, other].map(closed), [false, false, false], 'two from 127.0.0.2 and one from 127.0.0.3 linger')
  const third = await refusedUpload(built, '127.0.0.2')
  const all = [first, second, third, other]
  await serverClosed(second)
  t.same(all.map(closed), [false, true, false, false], 'a third from 127.0.0.2 cut its newest only')
  for (const s of all) t.match(s.text(), /^HTTP\/1\.1 401 Unauthorized\r\n/, 'each read its answer first')
  for (const s of [first, third, other]) s.client.destroy()
})

t.test('past the total cap a flood from many addresses cuts its own lingers before a client holding one', async (t) => {
  const built = recordConnections(await build(t, { env: { LINGER_MAX_SOCKETS: '4', LINGER_MAX_PER_ADDRESS: '4' } }))
  const phone = await refusedUpload(built, '127.0.0.4')
  const flood: Lingering[] = []
  for (let i = 0; i < 3; i++) flood.push(await refusedUpload(built, '127.0.0.5'))
  t.same([phone, ...flood].map(closed), [false, false, false, false], 'the phone and three from 127.0.0.5 linger')
  const fromSix = await refusedUpload(built, '127.0.0.6')
  await serverClosed(flood[2]!)
  t.same([phone, ...flood].map(closed), [false, false, false, true], 'a new address cut one of the address with most')
  const fromSeven = await refusedUpload(built, '127.0.0.7')
  await serverClosed(flood[1]!)
  t.same([phone, ...flood].map(closed), [false, false, true, true], 'and again, while 127.0.0.5 held two')
  t.equal(closed(fromSix), false, 'the address that came first in the flood still lingers')
  // Every address holds one now, none has sent since: the newest goes, never the phone for being the oldest.
  const fromEight = await refusedUpload(built, '127.0.0.8')
  await serverClosed(fromSeven)
  const rest = [phone, flood[0]!, fromSix, fromEight]
  t.same(rest.map(closed), [false, false, false, false], 'one address each: the newest went')
  for (const s of [...flood, fromSeven, ...rest]) t.match(s.text(), /^HTTP\/1\.1 401 Unauthorized\r\n/, 'each read its answer')
  const samples = parseExposition((await built.metrics.scrape()).body)
  t.equal(valueOf(samples, 'gateway_lingers_ended_total', { reason: 'total_cap' }), 3, 'three cut by the total cap')
  t.equal(valueOf(samples, 'gateway_lingering_connections'), 4)
  for (const s of rest) s.client.destroy()
})

t.test('an IPv6 client is counted by its /64, an IPv4-mapped one as its IPv4 address', async (t) => {
  t.equal(addressKey('2001:db8:1:2:aaaa::1'), '2001:db8:1:2::/64')
  t.equal(addressKey('2001:db8:1:2:bbbb:cccc:dddd:eeee'), '2001:db8:1:2::/64')
  t.equal(addressKey('2001:0db8:0001:0002::'), '2001:db8:1:2::/64')
  t.equal(addressKey('2001:db8::1'), '2001:db8:0:0::/64')
  t.equal(addressKey('::1'), '0:0:0:0::/64')
  t.equal(addressKey('fe80::1%eth0'), 'fe80:0:0:0::/64')
  t.equal(addressKey('::ffff:127.0.0.9'), '127.0.0.9')
  t.equal(addressKey('::FFFF:10.1.2.3'), '10.1.2.3')
  t.equal(addressKey('10.1.2.3'), '10.1.2.3')
  t.equal(addressKey('2001:db8:1:3::1') === addressKey('2001:db8:1:2::1'), false, 'another /64 is another client')
  const cuts: Array<[string, LingerCut]> = []
  const lingers = new Lingers({ bodyFactor: 2, maxSockets: 8, maxPerAddress: 2 }, () => () => {})
  const admit = (address: string, id: string): void => { lingers.admit(address, id, (cap) => { cuts.push([id, cap]) }) }
  admit('2001:db8:1:2::a', 'a')
  admit('2001:db8:1:2:ffff::b', 'b')
  admit('::ffff:192.0.2.1', 'mapped')
  admit('192.0.2.1', 'plain')
  t.same(cuts, [], 'two in one /64, two from one IPv4 address: within the cap of 2')
  admit('2001:db8:1:2::c', 'c')
  admit('192.0.2.1', 'third-v4')
  t.same(cuts, [['b', 'address_cap'], ['plain', 'address_cap']], 'a third in each cut one of its own (the newest)')
  t.equal(lingers.sizeOf('2001:db8:1:2::1'), 2)
  t.equal(lingers.size, 4)
})

t.test('the address forms a peer or a balancer gives are keyed as the client they name', async (t) => {
  const forms: Array<[string, string]> = [
    ['0:0:0:0:0:ffff:1.2.3.4', '1.2.3.4'],
    ['::ffff:102:304', '1.2.3.4'],
    ['::FFFF:0102:0304', '1.2.3.4'],
    ['[::ffff:1.2.3.4]', '1.2.3.4'],
    ['1.2.3.4:5678', '1.2.3.4'],
    ['[2001:db8::1]', '2001:db8:0:0::/64'],
    ['[2001:db8::1]:443', '2001:db8:0:0::/64'],
    ['[fe80::1%eth0]:80', 'fe80:0:0:0::/64'],
    ['2001:DB8:0:0:1::1', '2001:db8:0:0::/64'],
    ['2001:db8:0:0:0:0:0:1', '2001:db8:0:0::/64'],
    ['::', '0:0:0:0::/64'],
    ['::1', '0:0:0:0::/64'],
    ['unknown', 'unknown'],
    ['', '']
  ]
  for (const [form, key] of forms) t.equal(addressKey(form), key, form)
  t.not(addressKey('::ffff:102:304'), addressKey('::1'), 'a mapped IPv4 client is not the IPv6 loopback\'s /64')
})

t.test('past a cap, the linger with the most time left goes: an unknown end first, ties the newest', async (t) => {
  const cuts: string[] = []
  const lingers = new Lingers({ bodyFactor: 2, maxSockets: 4, maxPerAddress: 3 }, () => () => {})
  const admit = (address: string, id: string, left: number): void => {
    lingers.admit(address, id, () => { cuts.push(id) }, () => left)
  }
  admit('192.0.2.1', 'soon', 1_000)
  admit('192.0.2.1', 'late', 60_000)
  admit('192.0.2.1', 'sooner', 10)
  admit('192.0.2.1', 'fourth', 5)
  t.same(cuts, ['late'], 'within an address: the one with most time left')
  admit('192.0.2.2', 'unknown', Infinity)
  t.same(cuts, ['late'], 'four in all: within the total cap')
  admit('192.0.2.3', 'unknown-too', Infinity)
  t.same(cuts, ['late', 'soon'], 'the total cap: among the address holding the most (three), the most time left')
  admit('192.0.2.4', 'new', 1)
  t.same(cuts, ['late', 'soon', 'sooner'], 'still the address holding the most, whatever the others have left')
  admit('192.0.2.5', 'last', 1)
  t.same(cuts, ['late', 'soon', 'sooner', 'unknown-too'], 'one each: an unknown end goes first, the newest of those')
})

t.test('past the total cap, with every address holding one, a paced phone still reads its body to the end', async (t) => {
  const built = recordConnections(await build(t, { env: { LINGER_MAX_SOCKETS: '4', LINGER_MAX_PER_ADDRESS: '4' } }))
  const phone = await refusedUpload(built, '127.0.0.20', MiB)
  const held = [await refusedUpload(built, '127.0.0.21'), await refusedUpload(built, '127.0.0.22')]
  held.push(await refusedUpload(built, '127.0.0.23'))
  const piece = Buffer.alloc(64 * 1024, 0x61)
  const ended = once(phone.server, 'close')
  const arrivals: Lingering[] = []
  // Before each piece the phone sends, one more refused client comes from a new address, the cap full.
  for (let sent = 1024; sent < MiB; sent += piece.length) {
    arrivals.push(await refusedUpload(built, `127.0.1.${arrivals.length + 1}`))
    phone.client.write(piece.subarray(0, Math.min(piece.length, MiB - sent)))
  }
  await ended
  t.equal(phone.server.bytesRead > MiB, true, 'the phone\'s whole body was read')
  t.match(phone.text(), /^HTTP\/1\.1 401 Unauthorized\r\n/, 'and it read its 401')
  const samples = parseExposition((await built.metrics.scrape()).body)
  t.equal(valueOf(samples, 'gateway_lingers_ended_total', { reason: 'complete' }), 1, 'its linger completed')
  t.equal(valueOf(samples, 'gateway_lingers_ended_total', { reason: 'total_cap' }), 16, 'each arrival cut another')
  for (const s of [...held, ...arrivals]) s.client.destroy()
})

t.test('a client that sends most of its body at once, then trickles, does not look nearly done', async (t) => {
  t.setTimeout(30_000) // six seconds of trickle: the time-left estimate looks back five
  const built = recordConnections(await build(t, { env: { LINGER_MAX_SOCKETS: '2', LINGER_MAX_PER_ADDRESS: '2' } }))
  // Declares 9 MiB, sends 8.5 MiB at once, then 8 KiB a second: above the minimum rate, half a MiB still to come.
  const gamer = await refusedUpload(built, '127.0.0.40', 9 * MiB)
  gamer.client.write(Buffer.alloc(8.5 * MiB - 1024, 0x61))
  const trickle = setInterval(() => { if (gamer.client.writable) gamer.client.write('x'.repeat(2048)) }, 250)
  // A phone at 256 KiB/s with 4 MiB to send.
  const phone = await refusedUpload(built, '127.0.0.41', 4 * MiB)
  const pace = setInterval(() => { if (phone.client.writable) phone.client.write(Buffer.alloc(16 * 1024, 0x61)) }, 62.5)
  t.teardown(() => { clearInterval(trickle); clearInterval(pace) })
  // Six seconds on, the burst has left the estimate's window; a newcomer fills the total cap.
  await new Promise((resolve) => setTimeout(resolve, 6_000))
  const newcomer = await refusedUpload(built, '127.0.0.42', MiB)
  await Promise.race([serverClosed(gamer), serverClosed(phone)])
  t.ok(closed(gamer), 'the trickler was cut: its half MiB at 8 KiB/s is a minute away')
  t.notOk(closed(phone), 'the phone, seconds from its end, kept its linger')
  for (const s of [gamer, phone, newcomer]) s.client.destroy()
})

t.test('metrics and the log: lingering connections, lingers ended by reason, a line with the request id per cut', async (t) => {
  const lines: Array<Record<string, unknown>> = []
  const stream = new Writable({
    write (chunk, _enc, cb) {
      for (const text of String(chunk).split('\n').filter(Boolean)) lines.push(JSON.parse(text) as Record<string, unknown>)
      cb()
    }
  })
  const env = { LINGER_MAX_SOCKETS: '8', LINGER_MAX_PER_ADDRESS: '1' }
  const built = recordConnections(await build(t, { env, logger: { level: 'info', stream } }))
  const gauge = async (): Promise<number | undefined> =>
    valueOf(parseExposition((await built.metrics.scrape()).body), 'gateway_lingering_connections')
  const ended = async (reason: string): Promise<number | undefined> =>
    valueOf(parseExposition((await built.metrics.scrape()).body), 'gateway_lingers_ended_total', { reason })
  t.equal(await ended('address_cap'), 0, 'every reason is there from the start')
  const first = await refusedUpload(built, '127.0.0.9', 4096, 'r-linger-first')
  t.equal(await gauge(), 1, 'one lingers')
  const second = await refusedUpload(built, '127.0.0.9', 4096, 'r-linger-second')
  await serverClosed(first)
  t.equal(await gauge(), 1, 'the second took the first one\'s place')
  t.equal(await ended('address_cap'), 1)
  const cut = lines.filter((l) => l.msg === 'lingering connection cut to make room')
  t.same(cut.map(({ reqId, cap }) => ({ reqId, cap })), [{ reqId: 'r-linger-first', cap: 'address_cap' }])
  t.notMatch(JSON.stringify(cut), /Bearer|authorization/i, 'no token in the line')
  // The rest of the declared 4096 bytes: the body is read to its end.
  second.client.write('x'.repeat(4096 - 1024))
  await serverClosed(second)
  t.equal(await ended('complete'), 1, 'read to its end')
  const third = await refusedUpload(built, '127.0.0.10', 4096)
  third.client.destroy()
  await serverClosed(third)
  t.equal(await ended('client_closed'), 1, 'the client closed')
  t.equal(await gauge(), 0, 'none lingers')
  first.client.destroy()
  second.client.destroy()
})

setFlagsFromString('--expose-gc')
const gc = runInNewContext('gc') as () => void

/**
 * What this process holds alive: the JS heap and the buffers outside it, after full collections. The RSS counted
 * the young generation's growth and buffers freed but not yet swept too: run alone (tap --grep), the test below
 * saw it grow 32.5 to 61.3 MiB with nothing kept.
 */
async function liveBytes (): Promise<number> {
  for (let i = 0; i < 3; i++) {
    gc()
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
  const { heapUsed, arrayBuffers } = process.memoryUsage()
  return heapUsed + arrayBuffers
}

t.test('many refused bodies through a small cap: each is thrown away, and memory stays flat', async (t) => {
  const built = recordConnections(await build(t, { env: { LINGER_MAX_SOCKETS: '4', LINGER_MAX_PER_ADDRESS: '4' } }))
  const chunk = Buffer.alloc(256 * 1024, 0x61)
  const sendAll = async (s: Lingering, bytes: number): Promise<void> => {
    for (let sent = 1024; sent < bytes && !s.client.destroyed; sent += chunk.length) {
      if (!s.client.write(chunk.subarray(0, Math.min(chunk.length, bytes - sent)))) {
        await new Promise((resolve) => { s.client.once('drain', resolve).once('close', resolve) })
      }
    }
  }
  let before = 0
  let evicted = 0
  // 32 refused 8 MiB bodies, 8 at a time against a cap of 4: 256 MiB sent, half of the sockets cut.
  for (let round = 0; round < 4; round++) {
    const batch = await Promise.all(Array.from({ length: 8 }, async () => await refusedUpload(built, '127.0.0.8')))
    await Promise.all(batch.map(async (s) => await sendAll(s, 8 * MiB)))
    await Promise.all(batch.map(serverClosed))
    evicted += batch.filter((s) => s.server.bytesRead < 8 * MiB).length
    for (const s of batch) s.client.destroy()
    if (round === 0) before = await liveBytes()
  }
  const grown = (await liveBytes() - before) / MiB
  t.equal(evicted, 16, 'of each 8, 4 were cut when the next 4 came')
  // A gateway that kept what it read would hold the last 3 rounds' bodies read to their end: 96 MiB.
  t.ok(grown < 32, `from the first round to the last the live heap and buffers grew by ${grown.toFixed(1)} MiB (192 MiB went by)`)
})

t.test('a lingering create holds no per-user place: the same user is served while it lingers', async (t) => {
  const engine = await startStubUpstream()
  t.teardown(async () => { await engine.close() })
  const built = recordConnections(await build(t, { upstreamUrl: engine.url, env: { UPLOAD_MAX_PER_USER: '1' } }))
  const token = hs256({ sub: 'one-place' })
  // A bad field before the image: refused mid-body, the rest of its 8 MiB still to come.
  const badFields = [{ name: 'name', value: 'x'.repeat(40) }, { name: 'type', value: 'PORTFOLIO' }]
  const bad = multipartBody([...badFields, imagePart(pngOfSize(8 * MiB))], 'b')
  const since = acceptedSoFar(built.app.server)
  const client = connect({ port: Number(new URL(built.url).port), host: '127.0.0.1', allowHalfOpen: true })
  client.on('error', () => {})
  await once(client, 'connect')
  const server = await serverSideOf(built.app.server, client, since)
  client.resume() // 'end' comes once what precedes it is read
  t.teardown(() => client.destroy())
  const lingering = once(client, 'end')
  client.write('POST /api/portfolio/create HTTP/1.1\r\nhost: x\r\n' +
    `authorization: Bearer ${token}\r\ncontent-type: ${bad.contentType}\r\n` +
    `content-length: ${bad.body.length}\r\n\r\n`)
  client.write(bad.body.subarray(0, 64 * 1024))
  await lingering
  const form = multipartBody([...CREATE_FIELDS, imagePart(pngOfSize(1024))])
  const headers = { authorization: `Bearer ${token}`, 'content-type': form.contentType }
  const second = await viaPython(built.url, { path: '/api/portfolio/create', headers, body: form.body })
  t.equal(server.destroyed, false, 'the refused create still lingers')
  t.equal(second.status, 200, 'the same user\'s next create is served')
  t.same(JSON.parse(second.body ?? 'null'), { portfolio_id: 'p-stub-1' })
})
