/**
 * Engine connections and creates (DECISIONS 22), over real
 * sockets. Valid creates share one pooled engine connection. A non-image never
 * opens an engine request (its first bytes are sniffed first), so it costs
 * none. A refusal after the image began aborts the engine request: that costs
 * its one connection (DECISIONS 22: cheap, and a complete request carrying a
 * truncated form is worse), and the engine stores nothing. An engine that
 * answers mid-upload closes the client's connection (DECISIONS 21).
 */
import { readFileSync } from 'node:fs'
import t, { type Test } from 'tap'
import { request } from 'undici'
import { GIF_IMAGE, PNG_IMAGE } from '../../../fixtures/images.js'
import { json, startStubUpstream } from '../../../fixtures/stub-upstream.js'
import { bearer, build } from '../../helpers/app.js'
import { startEngine } from '../../helpers/engine.js'
import { rawConnection } from '../../helpers/raw-client.js'
import {
  CREATE_FIELDS as BASE,
  createValidationError as err,
  imagePart as image,
  multipartBody,
  pngOfSize as bigPng,
  type MultipartPart
} from '../../helpers/multipart.js'

const PNG = readFileSync(PNG_IMAGE)
const MiB = 1024 * 1024

/** [case, form, message, engine connections it costs] */
const REJECTED: Array<[string, MultipartPart[], string, number]> = [
  ['a non-image', [...BASE, image(readFileSync(GIF_IMAGE))], 'image must be a PNG or JPEG file', 0],
  ['an oversized image', [...BASE, image(bigPng(10 * MiB + 1))], 'image must be at most 10485760 bytes', 1],
  [
    'a bad field after the image',
    [BASE[1]!, image(PNG), { name: 'name', value: '' }],
    'name must be at least 1 character',
    1
  ],
  ['a second image', [...BASE, image(PNG), image(PNG)], 'image must be given once', 1]
]

t.test('valid creates share one engine connection; a refusal costs at most its own (reference engine)', async (t) => {
  const engine = await startEngine(t)
  let connections = 0
  engine.engine.server.on('connection', () => {
    connections++
  })
  // A long pool keep-alive, so an idle moment on a loaded runner does not open a socket either, and a
  // long engine timeout, so a slow first answer on a loaded runner is not a 504 that costs a socket.
  const { url } = await build(t, {
    upstreamUrl: engine.origin,
    engineKeepAliveMs: 30_000,
    env: { UPSTREAM_TIMEOUT_MS: '10000' }
  })
  const post = async (parts: MultipartPart[]) => {
    const { body, contentType } = multipartBody(parts)
    const res = await request(`${url}/api/portfolio/create`, {
      method: 'POST',
      headers: { ...bearer(), 'content-type': contentType },
      body
    })
    return { status: res.statusCode, json: await res.body.json() }
  }
  for (let i = 0; i < 3; i++) {
    t.equal((await post([...BASE, image(PNG)])).status, 200, `valid create ${i + 1}`)
  }
  t.equal(connections, 1, 'three valid creates, one engine connection')
  let expected = 1
  for (const [name, parts, message, cost] of REJECTED) {
    const res = await post(parts)
    t.equal(res.status, 400, name)
    t.same(res.json, err(message), `${name}: the gateway's own refusal`)
    // An aborted engine socket shows when the next create opens a new one.
    t.equal((await post([...BASE, image(PNG)])).status, 200, `${name}: the next valid create`)
    expected += cost
    t.equal(connections, expected, `${name}: ${cost} engine connection(s)`)
  }
  t.equal(engine.engine.portfolios.size, 3 + REJECTED.length, 'only the valid forms created portfolios')
})

/** A raw HTTP/1.1 client: sends `head` and part of a body, then reads until the gateway closes. */
async function partialUpload (
  t: Test,
  url: string,
  head: string,
  partOfBody: Buffer
): Promise<{ head: string; body: string }> {
  const client = await rawConnection(t, url)
  client.socket.write(head)
  client.socket.write(partOfBody)
  const [answerHead, answerBody] = await client.answer()
  return { head: answerHead, body: answerBody }
}

t.test('an engine that answers mid-upload: its answer, with connection: close', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  stub.early = (_req, res) =>
    json(res, 400, {
      success: false,
      error: { source: 'portfolio-engine', code: 'VALIDATION_ERROR', message: 'busy', function: 'createPortfolio' }
    })
  const { url } = await build(t, { upstreamUrl: stub.url })
  const { body, contentType } = multipartBody([...BASE, image(bigPng(8 * MiB))])
  // The client sends 1 MiB of an 8 MiB upload and waits: the rest is never read.
  const head = `POST /api/portfolio/create HTTP/1.1\r\nhost: gateway\r\nauthorization: ${bearer().authorization}\r\ncontent-type: ${contentType}\r\ncontent-length: ${body.length}\r\n\r\n`
  const answer = await partialUpload(t, url, head, body.subarray(0, MiB))
  t.match(answer.head, /^HTTP\/1\.1 400 /)
  t.match(answer.head, /\r\nconnection: close\r\n/i, 'the unread rest of the body ends the connection')
  t.match(answer.head, /\r\nx-request-id: \S+/i)
  t.same(JSON.parse(answer.body), {
    success: false,
    error: { source: 'portfolio-engine', code: 'VALIDATION_ERROR', message: 'busy', function: 'createPortfolio' }
  })
})
