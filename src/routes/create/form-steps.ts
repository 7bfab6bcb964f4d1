/** The form's steps that send nothing to the engine: a chunked body's bound, and a replay's full read. */
import type { IncomingMessage } from 'node:http'
import type { Writable } from 'node:stream'
import { CREATE_BODY_MAX_BYTES } from '../../../schemas/portfolio.js'
import { validationError, type GatewayError } from '../../http/errors.js'
import type { CreateUpload, UploadTiming } from './upload.js'

export const BODY_TOO_LARGE = `body must be at most ${CREATE_BODY_MAX_BYTES} bytes`

const UNTIMED: UploadTiming = { handedOver: () => {}, taken: () => {}, bodySent: () => {}, refused: () => {} }

/** Read, check and hash the whole form without sending it anywhere: a replay must still be the same form. */
export async function readWholeForm (upload: CreateUpload): Promise<void> {
  const image = await upload.readUntilImage()
  if (image === undefined) {
    upload.bufferedBody()
    return
  }
  const drained = upload.streamBody(image, UNTIMED)
  while ((await drained.next()).done !== true);
  if (upload.refusal !== undefined) throw upload.refusal
}

/**
 * A chunked body declares no length, so what the form parser is given is counted: the first `max` bytes, then its
 * input ends. The verdict waits for it to parse what it holds, so an image that passed its own bound in those bytes
 * names the refusal, however the socket's reads cut them; otherwise the body's bound does (400 with
 * `connection: close`), and `refuse` abandons the engine call. The rest is read and dropped, because closing a
 * socket with unread bytes sends a reset that can destroy the answer before the client reads it.
 */
export function limitBody (
  raw: IncomingMessage, max: number, upload: CreateUpload, refuse: (err: GatewayError) => void
): void {
  // @fastify/multipart pipes the body into its parser on the form's first read: the bound is on that parser's writes.
  raw.pipe = <T extends NodeJS.WritableStream>(destination: T, options?: { end?: boolean }): T => {
    Reflect.deleteProperty(raw, 'pipe')
    const parser = destination as unknown as Writable
    boundWrites(parser, max, () => {
      raw.unpipe(parser)
      raw.resume()
      void upload.bodyPassedBound(validationError(BODY_TOO_LARGE)).then(refuse)
    })
    return raw.pipe(destination, options)
  }
}

/** `parser` is written its first `max` bytes and then ended; `passed` is told once, when a write goes past. */
function boundWrites (parser: Writable, max: number, passed: () => void): void {
  const write = parser.write.bind(parser) as (chunk: Buffer) => boolean
  let room = max
  parser.write = ((chunk: Buffer): boolean => {
    if (chunk.length <= room) {
      room -= chunk.length
      return write(chunk)
    }
    if (room < 0) return true
    if (room > 0) write(chunk.subarray(0, room))
    room = -1
    parser.end()
    passed()
    // The pipe would pause the body on false, and the rest must still be read to be dropped.
    return true
  }) as Writable['write']
}
