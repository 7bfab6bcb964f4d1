/**
 * The create form, validated while it streams: fields as they arrive, the image by its first bytes before the
 * engine is called and by its size as it passes, so an upload costs the chunk in hand.
 */
import { createHash, type Hash } from 'node:crypto'
import type { MultipartFile, Multipart } from '@fastify/multipart'
import type { FastifyRequest } from 'fastify'
import {
  CREATE_FORM_LIMITS, CreatePortfolioField, CreatePortfolioFields, IMAGE_FIELD
} from '../../../schemas/portfolio.js'
import { GatewayError, validationError } from '../../http/errors.js'
import { ImageSniffer, NOT_AN_IMAGE, type ImageMime } from '../../shared/image-type.js'
import { isMalformedMultipart } from '../../shared/multipart-errors.js'
import { PART_WITHOUT_NAME, readTextPart } from '../../shared/form-parts.js'
import { formContent } from '../../shared/fingerprint.js'
import { MultipartWriter } from './form-writer.js'
import { toGatewayError } from '../../http/error-handler.js'
import { describeIssues, shownName, type SchemaIssue } from '../../shared/validation-messages.js'
import { Interruptible } from './interruptible.js'

/** What the streamed form reports to its create's exchange, which times the engine and the client by it. */
export interface UploadTiming {
  handedOver: (bytes: number) => void
  taken: () => void
  bodySent: () => void
  refused: (err: GatewayError) => void
}

/** The image part once its first bytes have said PNG or JPEG; nothing of it has gone to the engine yet. */
export interface SniffedImage {
  mime: ImageMime
  head: Buffer[]
}

type Validate = ((data: unknown) => boolean) & { errors?: unknown }

/** A broken body or a named limit is the client's (400); anything else, a bug of ours included, stays a 500. */
function clientError (err: unknown): GatewayError {
  if (isMalformedMultipart(err)) return validationError('multipart body is malformed or truncated')
  return toGatewayError(err as Error)
}

export class CreateUpload {
  readonly writer = new MultipartWriter()
  /** Why the form was refused once the engine request had begun: the client gets this, not the engine's failure. */
  refusal: GatewayError | undefined
  #imageEnded = false
  #formEnded = false
  /** Settles when streamBody's generator has exited (undici stops pulling it once the engine answers). */
  #streaming: Promise<void> | undefined
  readonly #fields = new Map<string, string>()
  readonly #parts: AsyncIterator<Multipart>
  readonly #checkField: Validate
  readonly #checkForm: Validate
  #image: { part: MultipartFile, chunks: AsyncIterator<Buffer>, sniffer: ImageSniffer } | undefined
  /** Set once a chunked body passed its bound: the parser's end and the reads it fails mean this. */
  #bodyPassed: GatewayError | undefined
  readonly #reads = new Interruptible()
  /** Only with an Idempotency-Key: hashing 10 MiB costs milliseconds. */
  readonly #imageHash: Hash | undefined

  constructor (request: FastifyRequest, opts: { fingerprint: boolean }) {
    this.#imageHash = opts.fingerprint ? createHash('sha256') : undefined
    this.#parts = request.parts()[Symbol.asyncIterator]()
    this.#checkField = request.compileValidationSchema(CreatePortfolioField) as Validate
    this.#checkForm = request.compileValidationSchema(CreatePortfolioFields) as Validate
  }

  /** The create is cut off (too slow): the read in progress fails with `err`. */
  cutOff (err: GatewayError): void {
    this.#reads.interrupt(err)
  }

  /**
   * The body passed its bound, and the parser has its last bytes. The image still arriving is read to its end here,
   * not by the engine, so the verdict waits on nothing but the parser: the image's own bound if those bytes passed
   * it, else `err`. Every read fails with it from then on.
   */
  async bodyPassedBound (err: GatewayError): Promise<GatewayError> {
    this.#bodyPassed = err
    const refusal = await this.#imageVerdict(err)
    this.refusal ??= refusal
    this.#reads.interrupt(this.refusal)
    return this.refusal
  }

  async #imageVerdict (err: GatewayError): Promise<GatewayError> {
    if (this.#image !== undefined && !this.#imageEnded) {
      const { part, chunks } = this.#image
      try {
        while (!part.file.truncated && (await chunks.next()).done !== true);
      } catch {
        // The parser's input ended mid-image: what it parsed is what the image is.
      }
    }
    return this.#pastBound(err)
  }

  /** Past the body's bound: the image's own bound if the parser saw it passed, else the body's (`err`). */
  #pastBound (err: GatewayError): GatewayError {
    return this.#image?.part.file.truncated === true ? tooLarge() : err
  }

  /** Fields up to the image, whose first bytes are sniffed so a non-image never opens an engine request. */
  async readUntilImage (): Promise<SniffedImage | undefined> {
    try {
      for (;;) {
        const next = await this.#next(this.#parts)
        if (next.done === true) return undefined
        const part = next.value
        if (part.fieldname === undefined || part.fieldname === '') throw validationError(PART_WITHOUT_NAME)
        if (part.type === 'file' && part.filename === undefined && part.fieldname !== IMAGE_FIELD) {
          // A text part with a content type @fastify/multipart would JSON-parse is read as text.
          const { value, truncated } = await this.#reads.wait(readTextPart(part.file, CREATE_FORM_LIMITS.fieldSize))
          this.#acceptField(part.fieldname, value, truncated)
          continue
        }
        if (part.type === 'file') {
          if (part.fieldname !== IMAGE_FIELD) {
            throw validationError(`${shownName(part.fieldname)} is not an ` +
            `accepted file field (only ${IMAGE_FIELD})`)
          }
          if (this.#image !== undefined) throw validationError(`${IMAGE_FIELD} must be given once`)
          return await this.#sniff(part)
        }
        this.#acceptField(part.fieldname, part.value, part.valueTruncated)
      }
    } catch (err) {
      throw this.#refusalFor(err)
    }
  }

  bufferedBody (): Buffer {
    this.#checkComplete()
    return Buffer.concat([...this.#encodedFields(), this.writer.end()])
  }

  /**
   * The form for the engine: the fields so far, the image as it arrives, then the rest. A refusal throws, so
   * undici destroys the engine socket and the engine never sees a complete request
   * (decision: a refused create never completes); the closing boundary goes out only once the whole form passed.
   */
  streamBody (image: SniffedImage, timing: UploadTiming): AsyncGenerator<Buffer> {
    const body = this.#streamBody(image, timing)
    const upload = this
    return (async function * () {
      // A generator never started has no reader for finishReading to wait for.
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
      await this.#readAfterImage()
      out.push(...this.#encodedFields().slice(sentBeforeImage))
    } catch (err) {
      this.refusal ??= this.#refusalFor(err)
      timing.refused(this.refusal)
      throw this.refusal
    }
    out.push(this.writer.end())
    const last = Buffer.concat(out)
    timing.handedOver(last.length)
    yield last
    timing.bodySent()
  }

  /** What an early answer left unread, read and checked so that a keyed create's fingerprint covers it all. */
  async finishReading (): Promise<void> {
    // One reader at a time: wait for undici to have let go of the generator.
    await this.#streaming
    if (this.refusal !== undefined) throw this.refusal
    try {
      if (this.#image === undefined) throw new Error('finishReading needs an image part being read')
      while (!this.#imageEnded) await this.#nextImageChunk()
      await this.#readAfterImage()
    } catch (err) {
      this.refusal ??= this.#refusalFor(err)
      throw this.refusal
    }
  }

  /**
   * A read's failure as the client's mistake. Past the body's bound, the parser's end (a truncated form) or the
   * interruption means that bound, unless the image passed its own first; a check of ours failing on bytes before
   * the bound keeps its own message.
   */
  #refusalFor (err: unknown): GatewayError {
    const passed = this.#bodyPassed
    if (passed === undefined || !(err === passed || isMalformedMultipart(err))) return clientError(err)
    return this.#pastBound(passed)
  }

  async #readAfterImage (): Promise<void> {
    if (this.#formEnded) return
    const another = await this.readUntilImage()
    if (another !== undefined) throw validationError(`${IMAGE_FIELD} must be given once`)
    this.#checkComplete()
    this.#formEnded = true
  }

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

  /** "The same request": the validated fields by name and the image's digest, not the boundary or the order. */
  contentDigest (): string {
    if (this.#imageHash === undefined) throw new Error('contentDigest needs an upload built with fingerprint: true')
    return formContent(this.#fields, this.#imageHash.digest('base64url'))
  }

  /** The one place each text field passes: checked against its schema, then kept. */
  #acceptField (name: string, value: unknown, truncated: boolean): void {
    if (name === IMAGE_FIELD) throw validationError(`${IMAGE_FIELD} must be a file`)
    if (this.#fields.has(name)) throw validationError(`${shownName(name)} must be given once`)
    if (!this.#checkField({ [name]: value })) {
      throw validationError(describeIssues(this.#checkField.errors as SchemaIssue[], 'form'))
    }
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
