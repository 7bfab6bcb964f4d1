/**
 * Rejected uploads cost no engine socket (issue 7 item 5), and an engine that
 * answers mid-upload closes the client's connection (DECISIONS 21), over real
 * sockets. A non-image never opens an engine request (its first bytes are
 * sniffed first); a refusal after the image began ends the engine's body
 * unfinished, so the engine refuses it after reading it whole and the pooled
 * socket stays open, where aborting the request would destroy it.
 */
import { once } from 'node:events'
import { readFileSync } from 'node:fs'
import { connect, type Socket } from 'node:net'
import t, { type Test } from 'tap'
import { request } from 'undici'
import { GIF_IMAGE, PNG_IMAGE } from '../fixtures/images.js'
import { json, startStubUpstream } from '../fixtures/stub-upstream.js'
import { bearer, build } from './helpers/app.js'
import { startEngine } from './helpers/engine.js'
import { multipartBody, type MultipartPart } from './helpers/multipart.js'

const PNG = readFileSync(PNG_IMAGE)
const MiB = 1024 * 1024
const BASE: MultipartPart[] = [{ name: 'name', value: 'Blue chips' }, { name: 'type', value: 'PORTFOLIO' }]
const image = (data: Buffer): MultipartPart => ({ name: 'image', filename: 'a.png', contentType: 'image/png', data })
const bigPng = (size: number): Buffer => {
  const data = Buffer.alloc(size, 0x42)
  PNG.copy(data, 0, 0, 8)
  return data
}
const err = (message: string): unknown => ({
  success: false,
  error: { source: 'portfolio-gateway', code: 'VALIDATION_ERROR', message, function: 'createPortfolio' }
})

const REJECTED: Array<[string, MultipartPart[], string]> = [
  ['a non-image', [...BASE, image(readFileSync(GIF_IMAGE))], 'image must be a PNG or JPEG file'],
  ['an oversized image', [...BASE, image(bigPng(10 * MiB + 1))], 'image must be at most 10485760 bytes'],
  ['a bad field after the image', [BASE[1]!, image(PNG), { name: 'name', value: '' }], 'name must be at least 1 character'],
  ['a second image', [...BASE, image(PNG), image(PNG)], 'image must be given once']
]

t.test('rejected uploads do not grow the engine connections (reference engine)', async (t) => {
  const engine = await startEngine(t)
  let connections = 0
  engine.engine.server.on('connection', () => { connections++ })
  // A long pool keep-alive, so an idle moment on a loaded runner does not open a socket either.
  const { url } = await build(t, { upstreamUrl: engine.origin, engineKeepAliveMs: 30_000 })
  const post = async (parts: MultipartPart[]) => {
    const { body, contentType } = multipartBody(parts)
    const res = await request(`${url}/api/portfolio/create`, { method: 'POST', headers: { ...bearer(), 'content-type': contentType }, body })
    return { status: res.statusCode, json: await res.body.json() }
  }
  const first = await post([...BASE, image(PNG)])
  t.equal(first.status, 200, 'a valid create opens the one engine connection')
  t.equal(connections, 1)
  for (let round = 1; round <= 2; round++) {
    for (const [name, parts, message] of REJECTED) {
      const res = await post(parts)
      t.equal(res.status, 400, `${name} (round ${round})`)
      t.same(res.json, err(message), `${name} (round ${round}): the gateway's own refusal, not the engine's`)
      t.equal(connections, 1, `${name} (round ${round}): still one engine connection`)
    }
  }
  const last = await post([...BASE, image(PNG)])
  t.equal(last.status, 200, 'the pooled socket still serves')
  t.equal(connections, 1)
  t.equal(engine.engine.portfolios.size, 2, 'only the two valid forms completed at the engine')
})

/** A raw HTTP/1.1 client: sends `head` and part of a body, then reads until the gateway closes. */
async function partialUpload (t: Test, url: string, head: string, partOfBody: Buffer): Promise<{ head: string, body: string }> {
  const { hostname, port } = new URL(url)
  const socket: Socket = connect(Number(port), hostname)
  t.teardown(() => socket.destroy())
  await once(socket, 'connect')
  const received: Buffer[] = []
  socket.on('data', (c: Buffer) => received.push(c))
  socket.on('error', () => {})
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()))
  socket.write(head)
  socket.write(partOfBody)
  await closed
  const [answerHead = '', answerBody = ''] = Buffer.concat(received).toString('latin1').split('\r\n\r\n')
  return { head: answerHead, body: answerBody }
}

t.test('an engine that answers mid-upload: its answer, with connection: close', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  stub.early = (_req, res) => json(res, 409, { success: false, error: { source: 'portfolio-engine', code: 'CONFLICT', message: 'busy', function: 'createPortfolio' } })
  const { url } = await build(t, { upstreamUrl: stub.url })
  const { body, contentType } = multipartBody([...BASE, image(bigPng(8 * MiB))])
  // The client sends 1 MiB of an 8 MiB upload and waits: the rest is never read.
  const head = `POST /api/portfolio/create HTTP/1.1\r\nhost: gateway\r\nauthorization: ${bearer().authorization}\r\ncontent-type: ${contentType}\r\ncontent-length: ${body.length}\r\n\r\n`
  const answer = await partialUpload(t, url, head, body.subarray(0, MiB))
  t.match(answer.head, /^HTTP\/1\.1 409 /)
  t.match(answer.head, /\r\nconnection: close\r\n/i, 'the unread rest of the body ends the connection')
  t.match(answer.head, /\r\nx-request-id: \S+/i)
  t.same(JSON.parse(answer.body), { success: false, error: { source: 'portfolio-engine', code: 'CONFLICT', message: 'busy', function: 'createPortfolio' } })
})
