/**
 * Reading the create form while it streams: validated multipart uploads.
 * Text fields are checked one by one as they arrive; the image is
 * checked by its first bytes before the engine is called and by its size as it
 * passes; the engine gets a form re-encoded by MultipartWriter. Memory per
 * upload: the chunk in hand.
 *
 * Every validated field passes through #acceptField and every image chunk
 * through #nextImageChunk: the two places where a digest of the form (for
 * idempotency) can be taken.
 */
import { createHash, type Hash } from 'node:crypto'
import type { MultipartFile, Multipart } from '@fastify/multipart'
import type { FastifyRequest } from 'fastify'
import { CREATE_FORM_LIMITS, CreatePortfolioField, CreatePortfolioFields, IMAGE_FIELD } from '../../../schemas/portfolio.js'
import { GatewayError, validationError } from '../../http/errors.js'
import { ImageSniffer, NOT_AN_IMAGE, type ImageMime } from '../../shared/image-type.js'
import { isMalformedMultipart } from '../../shared/multipart-errors.js'
import { PART_WITHOUT_NAME, readTextPart } from '../../shared/form-parts.js'
import { formContent } from '../../shared/fingerprint.js'
import { MultipartWriter } from './form-writer.js'
import { toGatewayError } from '../../http/error-handler.js'
import { describeIssues, shownName, type SchemaIssue } from '../../shared/validation-messages.js'
import { Interruptible } from './interruptible.js'

/** Callbacks that time the engine, not the client (see UploadClock). */
export interface UploadTiming {
  /** A chunk of `bytes` bytes, read from the client, is handed to the engine connection. */
  handedOver: (bytes: number) => void
  /** The engine connection took it: the next wait is on the client again. */
  taken: () => void
  /** The last byte of the form has gone to the engine. */
  bodySent: () => void
  /** The form was refused mid-upload: the engine request is to be aborted with `err` as the reason (DECISIONS 22). */
  refused: (err: GatewayError) => void
}

/** The image part once its first bytes have said PNG or JPEG; nothing of it has gone to the engine yet. */
export interface SniffedImage {
  mime: ImageMime
  /** The bytes read to decide the type. */
  head: Buffer[]
}

type Validate = ((data: unknown) => boolean) & { errors?: unknown }

/**
 * A failure while reading the form: the client's when busboy says the body is
 * broken or @fastify/multipart names a limit (400s); anything else, a bug of
 * ours included, stays an internal error.
 */
function clientError (err: unknown): GatewayError {
  if (isMalformedMultipart(err)) return validationError('multipart body is malformed or truncated')
  return toGatewayError(err as Error)
}

export class CreateUpload {
  readonly writer = new MultipartWriter()
  /**
   * Why the form was refused after the engine request had begun. The engine
   * request was then aborted (DECISIONS 22); the client gets this error, not
   * the engine's failure.
   */
  refusal: GatewayError | undefined
  /** Where reading stands: the image part's bytes, then the parts after it, then the end of the form. */
  #imageEnded = false
  #formEnded = false
  /** Settles when streamBody's generator has exited (undici stops pulling it once the engine answers). */
  #streaming: Promise<void> | undefined
  readonly #fields = new Map<string, string>()
  readonly #parts: AsyncIterator<Multipart>
  readonly #checkField: Validate
  readonly #checkForm: Validate
  #image: { part: MultipartFile, chunks: AsyncIterator<Buffer>, sniffer: ImageSniffer } | undefined
  /** Failed once the body is cut off (see cutOff): wakes every wait on the parser. */
  readonly #reads = new Interruptible()
  /**
   * The image bytes as they pass, for the Idempotency-Key fingerprint
   * (DECISIONS 16); only with a key: hashing 10 MiB costs milliseconds.
   */
  readonly #imageHash: Hash | undefined

  constructor (request: FastifyRequest, opts: { fingerprint: boolean }) {
    this.#imageHash = opts.fingerprint ? createHash('sha256') : undefined
    this.#parts = request.parts()[Symbol.asyncIterator]()
    this.#checkField = request.compileValidationSchema(CreatePortfolioField) as Validate
    this.#checkForm = request.compileValidationSchema(CreatePortfolioFields) as Validate
  }

  /** The body stops feeding the parser (too large): the read in progress fails with `err`. */
  cutOff (err: GatewayError): void {
    this.#reads.interrupt(err)
  }

  /**
   * Read text fields up to the image part, whose first bytes are read and
   * sniffed before this returns (so a non-image never opens an engine
   * request), or to the end of the form (undefined).
   */
  async readUntilImage (): Promise<SniffedImage | undefined> {
    try {
      for (;;) {
        const next = await this.#next(this.#parts)
        if (next.done === true) return undefined
        const part = next.value
        if (part.fieldname === undefined || part.fieldname === '') throw validationError(PART_WITHOUT_NAME)
        if (part.type === 'file' && part.filename === undefined && part.fieldname !== IMAGE_FIELD) {
          // A text part with a content type that @fastify/multipart would JSON-parse: read as text (see
          // shared/form-parts.ts).
          const { value, truncated } = await this.#reads.wait(readTextPart(part.file, CREATE_FORM_LIMITS.fieldSize))
          this.#acceptField(part.fieldname, value, truncated)
          continue
        }
        if (part.type === 'file') {
          if (part.fieldname !== IMAGE_FIELD) throw validationError(`${shownName(part.fieldname)} is not an accepted file field (only ${IMAGE_FIELD})`)
          if (this.#image !== undefined) throw validationError(`${IMAGE_FIELD} must be given once`)
          return await this.#sniff(part)
        }
        this.#acceptField(part.fieldname, part.value, part.valueTruncated)
      }
    } catch (err) {
      throw clientError(err)
    }
  }

  /** The whole form once every part has been read and checked: used when there is no image. */
  bufferedBody (): Buffer {
    this.#checkComplete()
    return Buffer.concat([...this.#encodedFields(), this.writer.end()])
  }

  /**
   * The form for the engine when an image came: the fields read so far, the
   * image as it arrives, then the rest of the form.
   *
   * A refusal from here on (image too large, a bad field after the image, a
   * broken or cut-off body, a client that left) must not complete the request
   * at the engine (DECISIONS 8, 22): the generator throws, and undici aborts
   * the engine request (the socket is destroyed, so the engine never sees a
   * complete HTTP request). The refusal is kept in `refusal` for the route to
   * answer with. The closing boundary goes out only once the whole form has
   * passed its checks.
   *
   * Small pieces (fields, the part head) ride with the first image bytes and
   * the fields after the image with the closing boundary, so each yield is one
   * socket write. (Gathering image data into 64 KiB writes was measured too:
   * no change in upload time, so the chunks go on as busboy gives them.)
   */
  streamBody (image: SniffedImage, timing: UploadTiming): AsyncGenerator<Buffer> {
    const body = this.#streamBody(image, timing)
    const upload = this
    return (async function * () {
      // Marked once undici starts pulling: a generator never started has no reader to wait for.
      let exited!: () => void
      upload.#streaming = new Promise<void>((resolve) => { exited = resolve })
      try {
        yield * body
      } finally {
        upload.#streaming = undefined
        exited()
      }
    })()
  }

  async * #streamBody (image: SniffedImage, timing: UploadTiming): AsyncGenerator<Buffer> {
    let out = [...this.#encodedFields(), this.writer.fileHead(IMAGE_FIELD, image.mime), ...image.head]
    const sentBeforeImage = this.#fields.size
    try {
      for (;;) {
        const piece = out.length === 1 ? out[0]! : Buffer.concat(out)
        timing.handedOver(piece.length)
        yield piece
        timing.taken()
        const chunk = await this.#nextImageChunk()
        if (chunk === undefined) break
        out = [chunk]
      }
      out = [this.writer.fileTail]
      // The rest of the form, read and checked like the fields before the image.
      await this.#readAfterImage()
      out.push(...this.#encodedFields().slice(sentBeforeImage))
    } catch (err) {
      this.refusal ??= clientError(err)
      timing.refused(this.refusal)
      throw this.refusal
    }
    out.push(this.writer.end())
    const last = Buffer.concat(out)
    timing.handedOver(last.length)
    yield last
    timing.bodySent()
  }

  /**
   * Read and check what is left of the form after the engine stopped taking
   * it (it answered before the upload ended), so that a fingerprint covers the
   * whole form (DECISIONS 16). Bounded by the same limits as
   * the upload. Rejects, with `refusal` set, when the form cannot be read to
   * its end or is not valid.
   */
  async finishReading (): Promise<void> {
    // One reader at a time: wait for undici to have let go of the generator.
    await this.#streaming
    if (this.refusal !== undefined) throw this.refusal
    try {
      if (this.#image === undefined) throw new Error('finishReading needs an image part being read')
      while (!this.#imageEnded) await this.#nextImageChunk()
      await this.#readAfterImage()
    } catch (err) {
      this.refusal ??= clientError(err)
      throw this.refusal
    }
  }

  /** The parts after the image, to the end of the form, which must then be complete. */
  async #readAfterImage (): Promise<void> {
    if (this.#formEnded) return
    const another = await this.readUntilImage()
    if (another !== undefined) throw validationError(`${IMAGE_FIELD} must be given once`)
    this.#checkComplete()
    this.#formEnded = true
  }

  /** Read the image's first bytes until they say PNG or JPEG; refuse anything else before the engine is called. */
  async #sniff (part: MultipartFile): Promise<SniffedImage> {
    const sniffer = new ImageSniffer()
    this.#image = { part, chunks: (part.file as AsyncIterable<Buffer>)[Symbol.asyncIterator](), sniffer }
    const head: Buffer[] = []
    while (sniffer.mime === undefined) {
      const chunk = await this.#nextImageChunk()
      if (chunk === undefined) throw validationError(sniffer.bytes === 0 ? `${IMAGE_FIELD} is empty` : NOT_AN_IMAGE)
      head.push(chunk)
    }
    return { mime: sniffer.mime, head }
  }

  /** The one place each image chunk passes: size and type checked; undefined at the end of the part. */
  async #nextImageChunk (): Promise<Buffer | undefined> {
    const { part, chunks, sniffer } = this.#image!
    if (this.#imageEnded) return undefined
    const next = await this.#next(chunks)
    // busboy cuts the file at fileSize and marks it truncated: stop reading there.
    if (part.file.truncated) throw tooLarge()
    if (next.done === true) {
      this.#imageEnded = true
      return undefined
    }
    if (!sniffer.push(next.value)) throw validationError(NOT_AN_IMAGE)
    this.#imageHash?.update(next.value)
    return next.value
  }

  #next<T> (iterator: AsyncIterator<T>): Promise<IteratorResult<T>> {
    return this.#reads.wait(iterator.next())
  }

  /**
   * What makes this form "the same request" (DECISIONS 16): the validated
   * fields sorted by name, and the image's digest. The boundary and the order
   * of the parts do not count. Valid once the whole form has been read.
   */
  contentDigest (): string {
    if (this.#imageHash === undefined) throw new Error('contentDigest needs an upload built with fingerprint: true')
    return formContent(this.#fields, this.#imageHash.digest('base64url'))
  }

  /** The one place each text field passes: checked against its schema, then kept. */
  #acceptField (name: string, value: unknown, truncated: boolean): void {
    if (name === IMAGE_FIELD) throw validationError(`${IMAGE_FIELD} must be a file`)
    if (this.#fields.has(name)) throw validationError(`${shownName(name)} must be given once`)
    if (!this.#checkField({ [name]: value })) throw validationError(describeIssues(this.#checkField.errors as SchemaIssue[], 'form'))
    // A value cut at fieldSize is longer than any field allows; the schema has said so above.
    if (truncated) throw validationError(`${shownName(name)} is longer than ${CREATE_FORM_LIMITS.fieldSize} bytes`)
    this.#fields.set(name, String(value))
  }

  #checkComplete (): void {
    if (!this.#checkForm(Object.fromEntries(this.#fields))) {
      throw validationError(describeIssues(this.#checkForm.errors as SchemaIssue[], 'form'))
    }
  }

  #encodedFields (): Buffer[] {
    return [...this.#fields].map(([name, value]) => this.writer.field(name, value))
  }
}

function tooLarge (): GatewayError {
  return validationError(`${IMAGE_FIELD} must be at most ${CREATE_FORM_LIMITS.fileSize} bytes`)
}
