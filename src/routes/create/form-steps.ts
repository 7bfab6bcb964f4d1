/** The form's steps that send nothing to the engine: a chunked body's bound, and a replay's full read. */
import type { IncomingMessage } from 'node:http'
import type { Writable } from 'node:stream'
import { CREATE_BODY_MAX_BYTES } from '../../../schemas/portfolio.js'
import { validationError } from '../../http/errors.js'
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
 * A chunked body declares no length: past `max` bytes the parser gets nothing more and its input ends. What it
 * already holds is still parsed, so an image that passed its own bound in those bytes names the refusal, whatever
 * the socket's reads made of them; otherwise the body's bound does (400 with `connection: close`). The rest is
 * read and dropped, because closing a socket with unread bytes sends a reset that can destroy the answer before
 * the client reads it.
 */
export function limitBody (raw: IncomingMessage, max: number, upload: CreateUpload): void {
  let seen = 0
  let parser: Writable | undefined
  // @fastify/multipart pipes the body into its parser on the form's first read; the bound ends that parser's input.
  raw.pipe = <T extends NodeJS.WritableStream>(destination: T, options?: { end?: boolean }): T => {
    parser = destination as unknown as Writable
    Reflect.deleteProperty(raw, 'pipe')
    return raw.pipe(destination, options)
  }
  const count = (chunk: Buffer): void => {
    seen += chunk.length
    if (seen <= max) return
    raw.off('data', count)
    raw.unpipe()
    raw.resume()
    upload.bodyPassedBound(validationError(BODY_TOO_LARGE), parser)
  }
  raw.on('data', count)
  // The parser is piped only after the key's claim (a Redis round trip): paused, the early bytes wait for it.
  raw.pause()
}
