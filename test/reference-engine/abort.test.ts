/**
 * A client that disconnects in the middle of an upload must leave neither a
 * file in the image directory nor a portfolio record. Raw sockets, because an
 * HTTP client will not send half a body and then vanish.
 */
import { readFileSync, readdirSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { connect } from 'node:net'
import { once } from 'node:events'
import t from 'tap'
import { PNG_IMAGE } from '../../fixtures/images.js'
import { USER, eventually, startEngine } from '../helpers/engine.js'
import { multipartBody } from '../helpers/multipart.js'

async function sendPartially (port: number, body: Buffer, contentType: string, bytes: number) {
  const socket = connect(port, '127.0.0.1')
  await once(socket, 'connect')
  socket.write([
    'POST /api/portfolio/create HTTP/1.1',
    'Host: 127.0.0.1',
    `x-user-id: ${USER}`,
    `content-type: ${contentType}`,
    `content-length: ${body.length}`,
    '', ''
  ].join('\r\n'))
  socket.write(body.subarray(0, bytes))
  return socket
}

/** True once the one file in `dir` holds `bytes` bytes: the engine has written the whole image part. */
function imageWritten (dir: string, bytes: number): boolean {
  const files = readdirSync(dir)
  return files.length === 1 && statSync(join(dir, files[0]!)).size === bytes
}

// 2 MiB: a PNG signature followed by padding, so the upload is still arriving when we hang up.
const bigImage = Buffer.concat([readFileSync(PNG_IMAGE), Buffer.alloc(2 * 1024 * 1024)])

t.test('hanging up mid-image leaves no file and no record', async (t) => {
  const { engine, imageDir, port, call } = await startEngine(t)
  const { body, contentType } = multipartBody([
    { name: 'name', value: 'Half' },
    { name: 'type', value: 'PORTFOLIO' },
    { name: 'image', filename: 'big.png', contentType: 'image/png', data: bigImage }
  ])
  const socket = await sendPartially(port, body, contentType, 1024 * 1024)
  t.ok(await eventually(() => readdirSync(imageDir).length === 1), 'the upload reached the disk')
  socket.destroy()
  t.ok(await eventually(() => readdirSync(imageDir).length === 0), 'the temporary file is removed')
  t.equal(engine.portfolios.size, 0)
  t.equal((await call('/health')).status, 200, 'the engine still serves')
})

t.test('hanging up after the image but before the form ends leaves nothing', async (t) => {
  const { engine, imageDir, port } = await startEngine(t)
  const { body, contentType } = multipartBody([
    { name: 'image', filename: 'big.png', contentType: 'image/png', data: bigImage },
    { name: 'name', value: 'Almost' },
    { name: 'type', value: 'PORTFOLIO' }
  ])
  // Stop inside the last field: the image part has been closed by the next boundary.
  const socket = await sendPartially(port, body, contentType, body.length - 60)
  // The image part ends at the next boundary: once all of it is on disk, the disconnect comes after the image.
  t.ok(await eventually(() => imageWritten(imageDir, bigImage.length), 10_000), 'the whole image was received')
  socket.destroy()
  t.ok(await eventually(() => readdirSync(imageDir).length === 0), 'the received image is removed')
  t.equal(engine.portfolios.size, 0)
})

t.test('a form whose closing boundary arrived, but not the declared length, is not recorded', async (t) => {
  const { engine, imageDir, port } = await startEngine(t)
  const { body, contentType } = multipartBody([
    { name: 'name', value: 'Epilogue' },
    { name: 'type', value: 'PORTFOLIO' },
    { name: 'image', filename: 'a.png', contentType: 'image/png', data: readFileSync(PNG_IMAGE) }
  ])
  // Declare 16 bytes of epilogue that never come: the HTTP request is not complete.
  const padded = Buffer.concat([body, Buffer.alloc(16, 0x20)])
  const socket = await sendPartially(port, padded, contentType, body.length)
  // The whole image on disk means busboy has passed the closing boundary: only the HTTP body is unfinished.
  const png = readFileSync(PNG_IMAGE)
  t.ok(await eventually(() => imageWritten(imageDir, png.length), 10_000), 'the whole image was received')
  t.equal(engine.portfolios.size, 0, 'nothing recorded while the request is incomplete')
  socket.destroy()
  t.ok(await eventually(() => readdirSync(imageDir).length === 0), 'the received image is removed')
  t.equal(engine.portfolios.size, 0)
})
