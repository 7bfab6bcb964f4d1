/** An image's type is its magic bytes, never the declared type or the file name (decision: image). */
export type ImageMime = 'image/png' | 'image/jpeg'

const SIGNATURES: ReadonlyArray<{ mime: ImageMime; name: string; ext: string; magic: Buffer }> = [
  { mime: 'image/png', name: 'PNG', ext: 'png', magic: Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]) },
  { mime: 'image/jpeg', name: 'JPEG', ext: 'jpg', magic: Buffer.from([0xff, 0xd8, 0xff]) }
]
const SNIFF_BYTES = Math.max(...SIGNATURES.map((s) => s.magic.length))

/** From the signatures, so the refusal and the OpenAPI document say the same. */
export const IMAGE_TYPE_NAMES = SIGNATURES.map((s) => s.name).join(' or ')

export const NOT_AN_IMAGE = `image must be a ${IMAGE_TYPE_NAMES} file`

export function sniffImage (head: Buffer): ImageMime | undefined {
  return SIGNATURES.find(({ magic }) => head.length >= magic.length && head.subarray(0, magic.length).equals(magic))
    ?.mime
}

function mayBecomeImage (head: Buffer): boolean {
  return SIGNATURES.some(({ magic }) => head.length < magic.length && magic.subarray(0, head.length).equals(head))
}

export function imageExtension (mime: ImageMime): string {
  return SIGNATURES.find((s) => s.mime === mime)?.ext ?? 'bin'
}

/** Decides as soon as the first bytes allow, so a file that is not an image fails at its first chunk. */
export class ImageSniffer {
  bytes = 0
  mime: ImageMime | undefined
  #head = Buffer.alloc(0)

  /** False as soon as the content cannot be an image. */
  push (chunk: Buffer): boolean {
    this.bytes += chunk.length
    if (this.mime !== undefined) return true
    this.#head = Buffer.concat([this.#head, chunk]).subarray(0, SNIFF_BYTES)
    this.mime = sniffImage(this.#head)
    return this.mime !== undefined || mayBecomeImage(this.#head)
  }
}
