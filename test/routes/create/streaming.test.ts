/**
 * Create over real sockets: the form reaches the engine re-encoded and
 * streamed, in any part order; the engine clock starts when the form is sent;
 * a client or engine that stops half-way leaves nothing behind.
 */
import { readdirSync, readFileSync } from 'node:fs'
import { connect } from 'node:net'
import { PassThrough } from 'node:stream'
import t from 'tap'
import { request } from 'undici'
import { JPEG_IMAGE, PNG_IMAGE } from '../../../fixtures/images.js'
import { faults, startStubUpstream } from '../../../fixtures/stub-upstream.js'
import { bearer, build, hs256, MINTS } from '../../helpers/app.js'
import { eventually, startEngine } from '../../helpers/engine.js'
import { multipartBody, type MultipartPart } from '../../helpers/multipart.js'

const PNG = readFileSync(PNG_IMAGE)
const JPEG = readFileSync(JPEG_IMAGE)
const MiB = 1024 * 1024
const FIELDS: MultipartPart[] = [
  { name: 'name', value: 'Blue chips' },
  { name: 'type', value: 'INDEX_PORTFOLIO' },
  { name: 'beneficiary_wallet', value: MINTS[1] },
  { name: 'description', value: 'Large caps, rebalanced weekly. Ünïcödé welcome.' }
]
const image = (data: Buffer, contentType = 'application/octet-stream'): MultipartPart => ({ name: 'image', filename: '../../etc/passwd', contentType, data })
const bigPng = (size: number): Buffer => {
  const data = Buffer.alloc(size)
  for (let i = 0; i < size; i += 4096) data[i] = i & 0xff
  PNG.copy(data, 0, 0, 8)
  return data
}

const post = (url: string, body: Buffer | PassThrough, contentType: string, token = hs256()) =>
  request(`${url}/api/portfolio/create`, { method: 'POST', headers: { ...bearer(token), 'content-type': contentType }, body })

t.test('create end to end with the reference engine: the same portfolio whatever the part order', async (t) => {
  const engine = await startEngine(t)
  const { url } = await build(t, { upstreamUrl: engine.origin })
  const orders: Array<[string, MultipartPart[], Buffer]> = [
    ['fields first, PNG', [...FIELDS, image(PNG)], PNG],
    ['image first, JPEG', [image(JPEG, 'image/png'), ...FIELDS.slice().reverse()], JPEG],
    ['image between fields', [FIELDS[0]!, image(PNG), ...FIELDS.slice(1)], PNG]
  ]
  for (const [name, parts, bytes] of orders) {
    const { body, contentType } = multipartBody(parts)
    const res = await post(url, body, contentType, hs256({ sub: 'dana' }))
    t.equal(res.statusCode, 200, name)
    const { portfolio_id: id } = await res.body.json() as { portfolio_id: string }
    const record = engine.engine.portfolios.get(id)!
    t.match(record, {
      owner: 'dana',
      name: 'Blue chips',
      type: 'INDEX_PORTFOLIO',
      beneficiary_wallet: MINTS[1],
      description: 'Large caps, rebalanced weekly. Ünïcödé welcome.',
      status: 'DRAFT',
      positions: [],
      image: { mime: bytes === PNG ? 'image/png' : 'image/jpeg', bytes: bytes.length }
    }, `${name}: record`)
    t.same(readFileSync(record.image!.path), bytes, `${name}: the stored image is byte-identical`)
  }

  const { body, contentType } = multipartBody([FIELDS[0]!, FIELDS[1]!])
  const noImage = await post(url, body, contentType)
  t.equal(noImage.statusCode, 200, 'no image')
  const { portfolio_id: id } = await noImage.body.json() as { portfolio_id: string }
  t.equal(engine.engine.portfolios.get(id)?.image, undefined)
})

t.test('the engine gets a form the gateway wrote: its own boundary, file name and sniffed type', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const { body, contentType } = multipartBody([image(PNG, 'text/html'), FIELDS[0]!, FIELDS[1]!])
  const res = await post(url, body, contentType)
  t.equal(res.statusCode, 200)
  t.same(await res.body.json(), { portfolio_id: 'p-stub-1' })
  const sent = stub.requests[0]!
  t.equal(sent.headers['x-user-id'], 'alice')
  t.match(sent.headers['content-type'], /^multipart\/form-data; boundary=----portfolio-gateway-[0-9a-f]{32}$/)
  const text = sent.body.toString('latin1')
  t.match(text, 'Content-Disposition: form-data; name="image"; filename="image.png"\r\nContent-Type: image/png\r\n\r\n')
  t.notMatch(text, 'passwd', "the client's file name is not forwarded")
  t.notMatch(text, 'text/html', "the client's declared type is not forwarded")
  t.ok(sent.body.includes(PNG), 'image bytes intact')
})

t.test('the engine receives image bytes while the client is still sending', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const { body, contentType } = multipartBody([...FIELDS.slice(0, 2), image(bigPng(4 * MiB))])
  const client = new PassThrough()
  const pending = post(url, client, contentType)
  client.write(body.subarray(0, 2 * MiB))
  t.ok(await eventually(() => stub.stats.bytes > MiB, 5000), 'over 1 MiB reached the engine before the client finished')
  t.equal(stub.requests.length, 0, 'and the engine has not got the whole form yet')
  client.end(body.subarray(2 * MiB))
  const res = await pending
  t.equal(res.statusCode, 200)
  await res.body.dump()
  t.ok(stub.requests[0]!.body.includes(body.subarray(body.indexOf(PNG.subarray(0, 8)), body.length - 100)), 'every image byte arrived')
})

t.test('a slow client is not cut off by UPSTREAM_TIMEOUT_MS', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url, env: { UPSTREAM_TIMEOUT_MS: '200' } })
  const { body, contentType } = multipartBody([...FIELDS.slice(0, 2), image(bigPng(256 * 1024))])
  const client = new PassThrough()
  const pending = post(url, client, contentType)
  const step = Math.ceil(body.length / 6)
  for (let i = 0; i < body.length; i += step) {
    client.write(body.subarray(i, i + step))
    await new Promise((resolve) => setTimeout(resolve, 150)) // ~900 ms in all, 4.5x the timeout
  }
  client.end()
  const res = await pending
  t.equal(res.statusCode, 200)
  t.same(await res.body.json(), { portfolio_id: 'p-stub-1' })
})

t.test('an engine that hangs after the whole form: 504 after UPSTREAM_TIMEOUT_MS', async (t) => {
  const stub = await startStubUpstream(faults.hang)
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url, env: { UPSTREAM_TIMEOUT_MS: '300' } })
  const { body, contentType } = multipartBody([...FIELDS.slice(0, 2), image(PNG)])
  const started = Date.now()
  const res = await post(url, body, contentType)
  t.equal(res.statusCode, 504)
  t.same(await res.body.json(), { error: 'portfolio engine timed out' })
  t.ok(Date.now() - started >= 280, 'not before the timeout')
})

t.test('an engine that stops reading mid-upload: 504 after the stall limit', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  stub.reading = false
  const { url } = await build(t, { upstreamUrl: stub.url, uploadStallTimeoutMs: 300 })
  const { body, contentType } = multipartBody([...FIELDS.slice(0, 2), image(bigPng(10 * MiB - 1024))])
  const res = await post(url, body, contentType)
  t.equal(res.statusCode, 504)
  t.same(await res.body.json(), { error: 'portfolio engine stopped reading the upload' })
  t.equal(res.headers.connection, 'close', 'the rest of the upload is not read')
})

t.test('an engine that resets mid-upload: 502', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  stub.reading = false
  const { url } = await build(t, { upstreamUrl: stub.url })
  const { body, contentType } = multipartBody([...FIELDS.slice(0, 2), image(bigPng(8 * MiB))])
  const client = new PassThrough()
  const pending = post(url, client, contentType)
  client.write(body.subarray(0, MiB))
  t.ok(await eventually(() => stub.stats.started > 0), 'the upload reached the engine')
  stub.resetAll()
  client.end(body.subarray(MiB))
  const res = await pending
  t.equal(res.statusCode, 502)
  t.same(await res.body.json(), { error: 'portfolio engine unavailable' })
})

t.test('a client that aborts mid-image: the engine request is aborted, nothing is created or left on disk', async (t) => {
  const engine = await startEngine(t)
  const { url } = await build(t, { upstreamUrl: engine.origin })
  const { body, contentType } = multipartBody([...FIELDS.slice(0, 2), image(bigPng(4 * MiB))])
  const { port } = new URL(url)
  const socket = connect(Number(port), '127.0.0.1')
  await new Promise((resolve) => socket.once('connect', resolve))
  socket.write(`POST /api/portfolio/create HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${hs256()}\r\nContent-Type: ${contentType}\r\nContent-Length: ${body.length}\r\n\r\n`)
  socket.write(body.subarray(0, 2 * MiB))
  // Wait until the image is visibly on its way to the engine, then hang up.
  t.ok(await eventually(() => readdirSync(engine.imageDir).length > 0, 5000), 'the engine started writing the image')
  socket.destroy()
  t.ok(await eventually(() => readdirSync(engine.imageDir).length === 0, 5000), 'the partial file is removed')
  t.equal(engine.engine.portfolios.size, 0, 'no portfolio was recorded')
})
