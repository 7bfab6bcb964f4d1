/**
 * Receiving the create form's image: streamed to a temporary file as it
 * arrives (never buffered whole), typed by its magic bytes (DECISIONS 5), and
 * renamed to its final name only once the whole request has been accepted.
 */
import { randomUUID } from 'node:crypto'
import { createWriteStream } from 'node:fs'
import { mkdir, rename, rm } from 'node:fs/promises'
import { join } from 'node:path'
import { Transform, type Readable, type TransformCallback } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { validationError } from './errors.js'

export type ImageMime = 'image/png' | 'image/jpeg'

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
}

const SIGNATURES: ReadonlyArray<{ mime: ImageMime, ext: string, magic: Buffer }> = [
  { mime: 'image/png', ext: 'png', magic: Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]) },
  { mime: 'image/jpeg', ext: 'jpg', magic: Buffer.from([0xff, 0xd8, 0xff]) }
]
const SNIFF_BYTES = Math.max(...SIGNATURES.map((s) => s.magic.length))

/** The type the content says it is (its magic bytes), or undefined when neither PNG nor JPEG. */
export function sniffImage (head: Buffer): ImageMime | undefined {
  return SIGNATURES.find(({ magic }) => head.length >= magic.length && head.subarray(0, magic.length).equals(magic))?.mime
}

/** True while `head` is too short to decide but still starts like a signature. */
function mayBecomeImage (head: Buffer): boolean {
  return SIGNATURES.some(({ magic }) => head.length < magic.length && magic.subarray(0, head.length).equals(head))
}

export function imageExtension (mime: ImageMime): string {
  return SIGNATURES.find((s) => s.mime === mime)?.ext ?? 'bin'
}

const NOT_AN_IMAGE = 'image must be a PNG or JPEG file'

/**
 * Counts bytes and checks the magic bytes as they pass. A file that is not an
 * image fails at its first chunk, so nothing more of it is written.
 */
class ImageSniffer extends Transform {
  bytes = 0
  mime: ImageMime | undefined
  #head = Buffer.alloc(0)

  override _transform (chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    this.bytes += chunk.length
    if (this.mime === undefined) {
      this.#head = Buffer.concat([this.#head, chunk]).subarray(0, SNIFF_BYTES)
      this.mime = sniffImage(this.#head)
      if (this.mime === undefined && !mayBecomeImage(this.#head)) return callback(validationError(NOT_AN_IMAGE))
    }
    callback(null, chunk)
  }

  override _flush (callback: TransformCallback): void {
    callback(this.mime === undefined ? validationError(NOT_AN_IMAGE) : null)
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
  const sniffer = new ImageSniffer()
  try {
    await pipeline(part.file, sniffer, createWriteStream(tempPath, { flags: 'wx' }))
    if (part.file.truncated === true || sniffer.bytes > maxBytes) {
      throw validationError(`image must be at most ${maxBytes} bytes`)
    }
    // _flush has run, so mime is set or the pipeline has already failed.
    return { tempPath, mime: sniffer.mime as ImageMime, bytes: sniffer.bytes }
  } catch (err) {
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
