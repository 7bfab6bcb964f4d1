/**
 * Receiving the create form's image: streamed to a temporary file as it
 * arrives (never buffered whole), typed by its magic bytes (DECISIONS 5), and
 * renamed to its final name only once the whole request has been accepted.
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

/** An image written to a temporary file, not yet part of any portfolio. */
export interface ReceivedImage {
  readonly tempPath: string
  readonly mime: ImageMime
  readonly bytes: number
  /** SHA-256 of the bytes, base64url: part of the form's Idempotency-Key fingerprint (shared/fingerprint.ts). */
  readonly sha256: string
}

/** The image digest of a form without an image: SHA-256 of no bytes, as the gateway's. */
export const NO_IMAGE_SHA256 = createHash('sha256').digest('base64url')

/**
 * Passes the upload through, feeding the gateway's ImageSniffer (both sides
 * decide "is this an image" by the same code) and the digest of its bytes. A file that is not an image
 * fails at its first chunk, so nothing more of it is written.
 */
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

/** A multipart file part: busboy marks `truncated` when it hit the fileSize limit. */
export interface FilePart {
  readonly file: Readable & { truncated?: boolean }
}

/**
 * Stream `part` to a temporary file in `dir`. On any failure (not an image,
 * too large, client gone, disk error) the temporary file is removed before
 * the error propagates, so a failed upload leaves nothing behind.
 */
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
    // _flush has run, so mime is set or the pipeline has already failed.
    return { tempPath, mime: sniffer.mime as ImageMime, bytes: sniffer.bytes, sha256: sniffing.hash.digest('base64url') }
  } catch (err) {
    // A pipeline that failed early (a body cut short) may still be opening the file: removed before
    // the open completes, it would be created after its removal and left behind.
    if (!sink.closed) await new Promise<void>((resolve) => sink.once('close', () => { resolve() }))
    await discardFile(tempPath)
    throw err
  }
}

/** Give a received image its final name, `<portfolioId>.<png|jpg>`. */
export async function storeImage (image: ReceivedImage, dir: string, portfolioId: string): Promise<StoredImage> {
  const path = join(dir, `${portfolioId}.${imageExtension(image.mime)}`)
  await rename(image.tempPath, path)
  return { path, mime: image.mime, bytes: image.bytes }
}

/** Remove a file that must not survive; a file already gone is fine. */
export async function discardFile (path: string): Promise<void> {
  await rm(path, { force: true })
}
