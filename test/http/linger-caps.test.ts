/**
 * DECISIONS 32: what reading the rest of refused bodies may cost. Lingering
 * sockets are capped per client address and in total, and past a cap the
 * oldest is cut; what the lingering sockets read is thrown away, so memory
 * stays flat; a lingering create holds no per-user place. Raw sockets from
 * several loopback addresses (127.0.0.0/8), with allowHalfOpen so the
 * server's FIN after its answer does not end their sending.
 */
import { once } from 'node:events'
import type { Server } from 'node:http'
import { connect, type Socket } from 'node:net'
import t from 'tap'
import { startStubUpstream } from '../../fixtures/stub-upstream.js'
import { build, hs256, type Built } from '../helpers/app.js'
import { CREATE_FIELDS, imagePart, multipartBody, pngOfSize } from '../helpers/multipart.js'
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
const badTokenHead = (length: number): string =>
  'POST /api/portfolio/create HTTP/1.1\r\nhost: x\r\nauthorization: Bearer bad\r\n' +
  `content-type: multipart/form-data; boundary=b\r\ncontent-length: ${length}\r\n\r\n`

/** A refused create from `from` whose body is still coming: it lingers until it ends, stalls, or is cut. */
async function refusedUpload ({ app, url }: Built, from: string, length = 8 * MiB): Promise<Lingering> {
  const port = Number(new URL(url).port)
  const client = connect({ port, host: '127.0.0.1', localAddress: from, allowHalfOpen: true })
  client.on('error', () => {}) // a cut socket is reset: that is what is tested
  await once(client, 'connect')
  const server = await serverSideOf(app.server, client)
  let text = ''
  client.setEncoding('latin1').on('data', (c: string) => { text += c })
  const lingering = once(client, 'end')
  client.write(badTokenHead(length) + 'x'.repeat(1024))
  await lingering
  return { client, server, lingering, text: () => text }
}

/** The server's socket for `client`, told apart from others accepted at the same time by the client's port. */
async function serverSideOf (listener: Server, client: Socket): Promise<Socket> {
  const mine = (socket: Socket): boolean =>
    socket.remotePort === client.localPort && socket.remoteAddress === client.localAddress
  const known = seen.get(listener)?.find(mine)
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

const closed = (s: Lingering): boolean => s.server.destroyed
const serverClosed = async (s: Lingering): Promise<void> => { if (!s.server.closed) await once(s.server, 'close') }

t.test('past the per-address cap the oldest socket of that address is cut; others keep theirs', async (t) => {
  const built = recordConnections(await build(t, { env: { LINGER_MAX_SOCKETS: '8', LINGER_MAX_PER_ADDRESS: '2' } }))
  const other = await refusedUpload(built, '127.0.0.3')
  const first = await refusedUpload(built, '127.0.0.2')
  const second = await refusedUpload(built, '127.0.0.2')
  t.same([first, second, other].map(closed), [false, false, false], 'two from 127.0.0.2 and one from 127.0.0.3 linger')
  const third = await refusedUpload(built, '127.0.0.2')
  await serverClosed(first)
  const all = [first, second, third, other]
  t.same(all.map(closed), [true, false, false, false], 'a third from 127.0.0.2 cut its oldest only')
  for (const s of all) t.match(s.text(), /^HTTP\/1\.1 401 Unauthorized\r\n/, 'each read its answer first')
  for (const s of [second, third, other]) s.client.destroy()
})

t.test('past the total cap the oldest lingering socket of all is cut', async (t) => {
  const built = recordConnections(await build(t, { env: { LINGER_MAX_SOCKETS: '3', LINGER_MAX_PER_ADDRESS: '3' } }))
  const held: Lingering[] = []
  for (const from of ['127.0.0.4', '127.0.0.5', '127.0.0.6']) held.push(await refusedUpload(built, from))
  t.same(held.map(closed), [false, false, false], 'three linger, one per address')
  const fourth = await refusedUpload(built, '127.0.0.7')
  await serverClosed(held[0]!)
  t.same([...held, fourth].map(closed), [true, false, false, false], 'a fourth cut the oldest, from another address')
  for (const s of [...held, fourth]) s.client.destroy()
})

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
    if (round === 0) before = process.memoryUsage().rss
  }
  const grown = (process.memoryUsage().rss - before) / MiB
  t.equal(evicted, 16, 'of each 8, the 4 oldest were cut when the next 4 came')
  t.ok(grown < 32, `from the first round to the last the process grew by ${grown.toFixed(1)} MiB (192 MiB went by)`)
})

t.test('a lingering create holds no per-user place: the same user is served while it lingers', async (t) => {
  const engine = await startStubUpstream()
  t.teardown(async () => { await engine.close() })
  const built = recordConnections(await build(t, { upstreamUrl: engine.url, env: { UPLOAD_MAX_PER_USER: '1' } }))
  const token = hs256({ sub: 'one-place' })
  // A bad field before the image: refused mid-body, the rest of its 8 MiB still to come.
  const badFields = [{ name: 'name', value: 'x'.repeat(40) }, { name: 'type', value: 'PORTFOLIO' }]
  const bad = multipartBody([...badFields, imagePart(pngOfSize(8 * MiB))], 'b')
  const client = connect({ port: Number(new URL(built.url).port), host: '127.0.0.1', allowHalfOpen: true })
  client.on('error', () => {})
  await once(client, 'connect')
  const server = await serverSideOf(built.app.server, client)
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
