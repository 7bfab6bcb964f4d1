/**
 * POST /api/portfolio/create, bad input over real sockets: each is a 400
 * VALIDATION_ERROR naming the field, and no form completes at the engine.
 * A form refused before its image's bytes (fields, a non-image) never starts
 * an engine request; one refused later (the image too large, a bad part
 * after it) aborts its engine request (DECISIONS 22): the stub engine, which
 * answers 200 to any create whose body completes, completes none.
 */
import { readFileSync } from 'node:fs'
import { createServer, type ServerResponse } from 'node:http'
import t, { type Test } from 'tap'
import { request } from 'undici'
import { GIF_IMAGE, PNG_IMAGE } from '../../../fixtures/images.js'
import { startStubUpstream } from '../../../fixtures/stub-upstream.js'
import { bearer, build, MINTS } from '../../helpers/app.js'
import { eventually } from '../../helpers/engine.js'
import { listenOnLoopback } from '../../helpers/processes.js'
import { chunkOf, rawConnection, type RawConnection } from '../../helpers/raw-client.js'
import { CREATE_FIELDS as BASE, createValidationError as err, imagePart as image, multipartBody, pngOfSize as bigPng, type MultipartPart } from '../../helpers/multipart.js'

const PNG = readFileSync(PNG_IMAGE)
const MiB = 1024 * 1024

const without = (name: string): MultipartPart[] => BASE.filter((p) => p.name !== name)
const withField = (name: string, value: string): MultipartPart[] => [...without(name), { name, value }]

/** Refused once the engine request has begun: a valid image came before the mistake. */
const AFTER_IMAGE = new Set(['image of 10 MiB plus one byte', 'two images', 'image first, then a bad name', 'image first, then no name', 'six parts'])

const CASES: Array<[string, MultipartPart[], string]> = [
  ['name missing', without('name'), 'name is required'],
  ['name empty', withField('name', ''), 'name must be at least 1 character'],
  ['name of 31 characters', withField('name', 'n'.repeat(31)), 'name must be at most 30 characters'],
  ['type missing', without('type'), 'type is required'],
  ['bad type', withField('type', 'HEDGE_FUND'), 'type must be one of PORTFOLIO, INDEX_PORTFOLIO'],
  ['wallet too short', [...BASE, { name: 'beneficiary_wallet', value: 'So1111111111' }], 'beneficiary_wallet must be at least 32 characters'],
  ['wallet too long', [...BASE, { name: 'beneficiary_wallet', value: 'S'.repeat(45) }], 'beneficiary_wallet must be at most 44 characters'],
  ['wallet not base58', [...BASE, { name: 'beneficiary_wallet', value: '0OIl' + MINTS[1].slice(4) }], 'beneficiary_wallet must be a base58 Solana address (32 bytes)'],
  ['description of 501 characters', [...BASE, { name: 'description', value: 'd'.repeat(501) }], 'description must be at most 500 characters'],
  ['description beyond the field size limit', [...BASE, { name: 'description', value: 'd'.repeat(5000) }], 'description must be at most 500 characters'],
  ['unknown field', [...BASE, { name: 'owner', value: 'mallory' }], 'owner is not an accepted field'],
  ['a field twice', [...BASE, { name: 'name', value: 'Again' }], 'name must be given once'],
  ['image as a text field', [...BASE, { name: 'image', value: 'not a file' }], 'image must be a file'],
  ['a file under another name', [...BASE, { name: 'avatar', filename: 'a.png', contentType: 'image/png', data: PNG }], 'avatar is not an accepted file field (only image)'],
  ['image of another format (GIF declared as PNG)', [...BASE, image(readFileSync(GIF_IMAGE))], 'image must be a PNG or JPEG file'],
  ['empty image', [...BASE, image(Buffer.alloc(0))], 'image is empty'],
  ['image shorter than any signature', [...BASE, image(PNG.subarray(0, 4))], 'image must be a PNG or JPEG file'],
  ['image of 10 MiB plus one byte', [...BASE, image(bigPng(10 * MiB + 1))], 'image must be at most 10485760 bytes'],
  ['two images', [...BASE, image(PNG), image(PNG)], 'image must be given once'],
  ['image first, then a bad name', [image(PNG), { name: 'type', value: 'PORTFOLIO' }, { name: 'name', value: '' }], 'name must be at least 1 character'],
  ['image first, then no name', [image(PNG), { name: 'type', value: 'PORTFOLIO' }], 'name is required'],
  ['a field name of 100 characters is cut in the message', [...BASE, { name: 'n'.repeat(100), value: 'x' }], `${'n'.repeat(64)}... is not an accepted field`],
  ['a file name of 100 characters is cut in the message', [...BASE, { name: 'f'.repeat(100), filename: 'a.png', contentType: 'image/png', data: PNG }], `${'f'.repeat(64)}... is not an accepted file field (only image)`],
  ['a file part without a name', [...BASE, { name: undefined, filename: 'a.png', contentType: 'image/png', data: PNG }], 'form part has no name'],
  ['a text part without a name', [...BASE, { name: undefined, value: 'x' }], 'form part has no name'],
  ['a broken JSON part is text, checked as such', [{ name: 'name', value: '{"a":', contentType: 'application/json' }, { name: 'type', value: '"PORTFOLIO"', contentType: 'application/json' }], 'type must be one of PORTFOLIO, INDEX_PORTFOLIO'],
  ['a JSON part past the field size', [...without('description'), { name: 'description', value: `"${'d'.repeat(5000)}"`, contentType: 'application/json' }], 'description must be at most 500 characters'],
  ['six parts', [...BASE, { name: 'description', value: 'x' }, { name: 'beneficiary_wallet', value: MINTS[0] }, image(PNG), { name: 'x', value: 'y' }], 'form must have at most 5 parts']
]

t.test('each bad form is a 400 naming the field; nothing completes at the engine', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  // An aborted engine request of an earlier case may reach the stub late, so starts are matched by request id.
  const refusedEarly = new Map<string, string>()
  for (const [name, parts, message] of CASES) {
    const { body, contentType } = multipartBody(parts)
    const res = await request(`${url}/api/portfolio/create`, { method: 'POST', headers: { ...bearer(), 'content-type': contentType }, body })
    t.equal(res.statusCode, 400, name)
    t.same(await res.body.json(), err(message), `${name}: body`)
    if (!AFTER_IMAGE.has(name)) refusedEarly.set(String(res.headers['x-request-id']), name)
  }
  for (const [id, name] of refusedEarly) t.notOk(stub.startedIds.includes(id), `${name}: refused before any engine request started`)
  t.ok(stub.stats.started <= AFTER_IMAGE.size, 'an engine request started only where the mistake came after a valid image')
  t.equal(stub.requests.length, 0, 'no request completed at the engine')
})

t.test('parts sent as application/json are the text they hold, never parsed', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const { body, contentType } = multipartBody([
    { name: 'name', value: '{"a":', contentType: 'application/json' },
    { name: 'type', value: 'PORTFOLIO', contentType: 'application/json; charset=utf-8' },
    { name: 'image', filename: 'a.png', contentType: 'image/png', data: PNG }
  ])
  const res = await request(`${url}/api/portfolio/create`, { method: 'POST', headers: { ...bearer(), 'content-type': contentType }, body })
  t.equal(res.statusCode, 200, 'neither part is JSON, and neither has to be')
  t.same(await res.body.json(), { portfolio_id: 'p-stub-1' })
  const form = stub.requests[0]!.body.toString('latin1')
  t.match(form, /name="name"\r\n\r\n\{"a":\r\n/, 'name reaches the engine as the text sent')
  t.match(form, /name="type"\r\n\r\nPORTFOLIO\r\n/)
  t.notMatch(form, /application\/json/, 'as plain text parts')
})

t.test('a body that is not multipart', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const asJson = await request(`${url}/api/portfolio/create`, { method: 'POST', headers: { ...bearer(), 'content-type': 'application/json' }, body: '{"name":"x","type":"PORTFOLIO"}' })
  t.equal(asJson.statusCode, 400)
  t.same(await asJson.body.json(), err('content-type must be multipart/form-data'))
  const asText = await request(`${url}/api/portfolio/create`, { method: 'POST', headers: { ...bearer(), 'content-type': 'text/plain' }, body: 'name=x' })
  t.equal(asText.statusCode, 400)
  t.same(await asText.body.json(), err('content-type must be multipart/form-data'))
  t.equal(stub.stats.started, 0)
})

t.test('a truncated multipart body', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  for (const [name, parts] of [['in the fields', BASE], ['in the image', [...BASE, image(bigPng(64 * 1024))]]] as const) {
    const { body, contentType } = multipartBody([...parts])
    // The body ends cleanly at the HTTP level, but the form never reaches its closing boundary.
    const cut = body.subarray(0, body.length - 200)
    const res = await request(`${url}/api/portfolio/create`, { method: 'POST', headers: { ...bearer(), 'content-type': contentType }, body: cut })
    t.equal(res.statusCode, 400, name)
    t.same(await res.body.json(), err('multipart body is malformed or truncated'), `${name}: body`)
  }
  t.ok(stub.stats.started <= 1, 'only the form cut in its image started an engine request')
  t.equal(stub.requests.length, 0, 'nothing completed at the engine')
})

t.test('part headers: busboy reads 16 pairs and 1 KiB per part, and skips the rest', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const b = 'b0undary'
  // The name part's own Content-Disposition comes after `before`: past the limits, it is never read.
  const send = (before: string) => request(`${url}/api/portfolio/create`, {
    method: 'POST',
    headers: { ...bearer(), 'content-type': `multipart/form-data; boundary=${b}` },
    body: `--${b}\r\nContent-Disposition: form-data; name="type"\r\n\r\nPORTFOLIO\r\n--${b}\r\n${before}\r\nContent-Disposition: form-data; name="name"\r\n\r\nBlue chips\r\n--${b}--\r\n`
  })
  const within = await send(Array.from({ length: 10 }, (_, i) => `X-H${i}: v`).join('\r\n'))
  t.equal(within.statusCode, 200, '10 pairs before it: read')
  await within.body.dump()
  for (const [what, before] of [
    ['20 header pairs', Array.from({ length: 20 }, (_, i) => `X-H${i}: v`).join('\r\n')],
    ['a 2 KiB header', `X-Pad: ${'p'.repeat(2048)}`]
  ] as const) {
    const res = await send(before)
    t.equal(res.statusCode, 400, `${what} before Content-Disposition: it is not read (busboy's defaults would read it)`)
    t.same(await res.body.json(), err('name is required'))
  }
  t.equal(stub.requests.length, 1)
  t.notMatch(stub.requests[0]!.body.toString('latin1'), /X-H\d/, 'no client part header reaches the engine')
})

/**
 * A raw client that has sent a chunked create's head; it writes the body's pieces as chunks and reads the answer at
 * the close. Had it gone on writing after the answer, the close would reach it as EPIPE before it read the answer.
 */
async function chunkedCreate (t: Test, url: string, contentType: string): Promise<RawConnection> {
  const client = await rawConnection(t, url)
  client.socket.write(`POST /api/portfolio/create HTTP/1.1\r\nhost: ${new URL(url).hostname}\r\nauthorization: ${bearer().authorization}\r\ncontent-type: ${contentType}\r\ntransfer-encoding: chunked\r\n\r\n`)
  return client
}

t.test('the whole create body is bounded, preamble and epilogue included', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const { body, contentType } = multipartBody(BASE)
  const padded = Buffer.concat([Buffer.alloc(11 * MiB, 0x20), body])
  const declared = await request(`${url}/api/portfolio/create`, { method: 'POST', headers: { ...bearer(), 'content-type': contentType }, body: padded })
  t.equal(declared.statusCode, 400)
  t.same(await declared.body.json(), err('body must be at most 10551296 bytes'), 'refused from its content-length, unread')
  t.equal(declared.headers.connection, 'close')

  // Chunked: no length declared, so the gateway counts, stops parsing past the
  // bound, and answers the same 400 with connection: close, then closes. The raw
  // socket sends one 64 KiB chunk past the bound and then waits.
  const client = await chunkedCreate(t, url, contentType)
  const size = 64 * 1024
  for (let sent = 0; sent <= 10551296; sent += size) await client.write(chunkOf(Buffer.alloc(size, 0x20)))
  const [head, text] = await client.answer()
  t.match(head, /^HTTP\/1\.1 400 /, 'a 400, not a dropped connection')
  t.match(head, /\r\nconnection: close\r\n/i)
  t.match(head, /\r\nx-request-id: \S+/i)
  t.same(JSON.parse(text), err('body must be at most 10551296 bytes'), 'refused once past the bound, the body unfinished')
  t.equal(stub.stats.started, 0, 'no engine request started')
})

/**
 * A form behind a preamble (skipped by the parser) sized so that the image's 10,485,761st byte is the body's
 * `crossing`th; the byte that passes the body's bound is its 10,551,297th.
 */
function imageCrossingAt (crossing: number): { padded: Buffer, contentType: string } {
  const { body, contentType } = multipartBody([...BASE, image(bigPng(10 * MiB + 64 * 1024))])
  const imageAt = body.indexOf(Buffer.from([0x89, 0x50, 0x4e, 0x47]))
  const preamble = Buffer.concat([Buffer.alloc(crossing - (10 * MiB + 1) - imageAt - 2, 0x20), Buffer.from('\r\n')])
  return { padded: Buffer.concat([preamble, body]), contentType }
}

t.test('the first bound the bytes pass names the refusal, however the socket reads them', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  // The image's crossing 65 bytes before the body's, then 1,000 after it; either way one client write, and usually
  // one read, carries both: the parser is given the bytes up to the body's bound and parses them all.
  for (const [crossing, first] of [[10551296 - 64, 'image must be at most 10485760 bytes'], [10551296 + 1000, 'body must be at most 10551296 bytes']] as const) {
    const { padded, contentType } = imageCrossingAt(crossing)
    t.equal(padded.indexOf(Buffer.from([0x89, 0x50, 0x4e, 0x47])) + 10 * MiB + 1, crossing)
    const client = await chunkedCreate(t, url, contentType)
    // Pieces of 64 KiB from 32 KiB on: the bound (161 x 64 KiB) and the image's crossing fall in one piece.
    const size = 64 * 1024
    for (let sent = 0; sent < padded.length && client.received() === ''; sent = sent === 0 ? size / 2 : sent + size) {
      await client.write(chunkOf(padded.subarray(sent, sent === 0 ? size / 2 : sent + size)))
    }
    const [head, text] = await client.answer()
    t.match(head, /^HTTP\/1\.1 400 /)
    t.match(head, /\r\nconnection: close\r\n/i)
    t.same(JSON.parse(text), err(first), `the image's crossing at byte ${crossing}`)
  }
  t.equal(stub.requests.length, 0, 'no create completed at the engine')
})

t.test('a body that passes its bound while its engine call waits for a connection is refused then, not after', async (t) => {
  // An engine that takes every create's form and answers when the test says.
  const held = new Set<ServerResponse>()
  const engine = createServer((req, res) => {
    held.add(res)
    req.resume()
  })
  const engineUrl = `http://127.0.0.1:${await listenOnLoopback(t, engine)}`
  const { url } = await build(t, { upstreamUrl: engineUrl, env: { UPLOAD_MAX_CONNECTIONS: '1', UPSTREAM_TIMEOUT_MS: '60000' } })
  const first = multipartBody([...BASE, image(PNG)])
  const occupying = request(`${url}/api/portfolio/create`, {
    method: 'POST', headers: { ...bearer(), 'content-type': first.contentType }, body: first.body
  })
  t.ok(await eventually(() => held.size === 1, 10_000), 'the one upload connection is held by the engine')

  // The second create's image starts 40 KiB before the body's bound: its engine call waits for the held connection
  // while the image arrives, and the bound passes in bytes the engine has not taken.
  const { body, contentType } = multipartBody([...BASE, image(bigPng(MiB))])
  const preamble = Buffer.concat([Buffer.alloc(10551296 - 40 * 1024 - 2, 0x20), Buffer.from('\r\n')])
  const padded = Buffer.concat([preamble, body])
  const client = await chunkedCreate(t, url, contentType)
  const size = 64 * 1024
  for (let sent = 0; sent < padded.length && client.received() === ''; sent += size) {
    await client.write(chunkOf(padded.subarray(sent, sent + size)))
  }
  const [head, text] = await client.answer()
  t.match(head, /^HTTP\/1\.1 400 /)
  t.same(JSON.parse(text), err('body must be at most 10551296 bytes'))
  t.equal(held.size, 1, 'the engine never saw the second create')
  for (const res of held) res.writeHead(200, { 'content-type': 'application/json' }).end('{"portfolio_id":"p-1"}')
  t.equal((await occupying).statusCode, 200, 'the first create is answered once the engine answers it')
})
