/**
 * The create form's image: streamed to a temporary file, typed by its magic bytes (decision: image), and renamed to
 * its final name only once the whole request has been accepted.
 */
import { createHash, randomUUID } from 'node:crypto'
import { createWriteStream } from 'node:fs'
import { mkdir, rename, rm } from 'node:fs/promises'
import { join } from 'node:path'
import { Transform, type Readable, type TransformCallback } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { ImageSniffer, imageExtension, NOT_AN_IMAGE, type ImageMime } from '../shared/image-type.js'
import { validationError } from './errors.js'

export interface StoredImage {
  readonly path: string
  readonly mime: ImageMime
  readonly bytes: number
}

export interface ReceivedImage {
  readonly tempPath: string
  readonly mime: ImageMime
  readonly bytes: number
  /** SHA-256 of the bytes, base64url, for the form's Idempotency-Key fingerprint. */
  readonly sha256: string
}

/** SHA-256 of no bytes, as the gateway's. */
export const NO_IMAGE_SHA256 = createHash('sha256').digest('base64url')

/** Uses the gateway's ImageSniffer, so both sides decide "is this an image" alike; a non-image fails at once. */
class SniffingStream extends Transform {
  readonly sniffer = new ImageSniffer()
  readonly hash = createHash('sha256')

  override _transform (chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    if (!this.sniffer.push(chunk)) return callback(validationError(NOT_AN_IMAGE))
    this.hash.update(chunk)
    callback(null, chunk)
  }

  override _flush (callback: TransformCallback): void {
    callback(this.sniffer.mime === undefined ? validationError(NOT_AN_IMAGE) : null)
  }
}

/** busboy marks `truncated` when it hit the fileSize limit. */
export interface FilePart {
  readonly file: Readable & { truncated?: boolean }
}

/** Stream `part` to a temporary file in `dir`; a failed upload leaves nothing behind. */
export async function receiveImage (part: FilePart, dir: string, maxBytes: number): Promise<ReceivedImage> {
  await mkdir(dir, { recursive: true })
  // A dot name that is not <uuid>.<ext>, so it can never be mistaken for a stored image.
  const tempPath = join(dir, `.upload-${randomUUID()}.part`)
  const sniffing = new SniffingStream()
  const { sniffer } = sniffing
  const sink = createWriteStream(tempPath, { flags: 'wx' })
  try {
    await pipeline(part.file, sniffing, sink)
    if (part.file.truncated === true || sniffer.bytes > maxBytes) {
      throw validationError(`image must be at most ${maxBytes} bytes`)
    }
    const sha256 = sniffing.hash.digest('base64url')
    return { tempPath, mime: sniffer.mime as ImageMime, bytes: sniffer.bytes, sha256 }
  } catch (err) {
    // An early failure may still be opening the file: removed before the open completes, it would be left behind.
    if (!sink.closed) await new Promise<void>((resolve) => sink.once('close', () => { resolve() }))
    await discardFile(tempPath)
    throw err
  }
}

export async function storeImage (image: ReceivedImage, dir: string, portfolioId: string): Promise<StoredImage> {
  const path = join(dir, `${portfolioId}.${imageExtension(image.mime)}`)
  await rename(image.tempPath, path)
  return { path, mime: image.mime, bytes: image.bytes }
}

export async function discardFile (path: string): Promise<void> {
  await rm(path, { force: true })
}
