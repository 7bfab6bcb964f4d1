/**
 * Reading the create form while it streams (issue: validated multipart
 * uploads). Text fields are checked one by one as they arrive; the image is
 * checked by its first bytes and its size as it passes; the engine gets a form
 * re-encoded by MultipartWriter. Memory per upload: the chunk in hand.
 */
import { createHash } from 'node:crypto'
import type { MultipartFile, Multipart } from '@fastify/multipart'
import type { FastifyRequest } from 'fastify'
import { CREATE_FORM_LIMITS, CreatePortfolioField, CreatePortfolioFields, IMAGE_FIELD } from '../../../schemas/portfolio.js'
import { GatewayError, validationError } from '../../http/errors.js'
import { ImageSniffer, NOT_AN_IMAGE } from '../../shared/image-type.js'
import { isMalformedMultipart } from '../../shared/multipart-errors.js'
import { MultipartWriter } from './form-writer.js'
import { toGatewayError } from '../../http/error-handler.js'
import { describeIssues, shownName, type SchemaIssue } from '../../shared/validation-messages.js'

/** Callbacks that time the engine, not the client (see UploadClock). */
export interface UploadTiming {
  /** A chunk is handed to the engine connection. */
  handedOver: () => void
  /** The engine connection took it: the next wait is on the client again. */
  taken: () => void
  /** The last byte of the form has gone to the engine. */
  bodySent: () => void
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
  readonly #fields = new Map<string, string>()
  readonly #parts: AsyncIterator<Multipart>
  readonly #checkField: Validate
  readonly #checkForm: Validate
  /** The image bytes as they pass, for the Idempotency-Key fingerprint (DECISIONS 16). */
  readonly #imageHash = createHash('sha256')

  constructor (request: FastifyRequest) {
    this.#parts = request.parts()[Symbol.asyncIterator]()
    this.#checkField = request.compileValidationSchema(CreatePortfolioField) as Validate
    this.#checkForm = request.compileValidationSchema(CreatePortfolioFields) as Validate
  }

  /** Read text fields up to the image part (returned) or the end of the form (undefined). */
  async readUntilImage (): Promise<MultipartFile | undefined> {
    try {
      for (;;) {
        const next = await this.#parts.next()
        if (next.done === true) return undefined
        const part = next.value
        if (part.type === 'file') {
          if (part.fieldname !== IMAGE_FIELD) throw validationError(`${shownName(part.fieldname)} is not an accepted file field (only ${IMAGE_FIELD})`)
          return part
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
   * image as it arrives, then the rest of the form. Throwing here aborts the
   * engine request, so an invalid form never completes at the engine.
   *
   * Small pieces (fields, the part head) ride with the next image chunk and
   * the fields after the image with the closing boundary, so each yield is one
   * socket write. (Gathering image data into 64 KiB writes was measured too:
   * no change in upload time, so the chunks go on as busboy gives them.)
   */
  async * streamBody (image: MultipartFile, timing: UploadTiming): AsyncGenerator<Buffer> {
    let out = this.#encodedFields()
    const sentBeforeImage = this.#fields.size
    try {
      const sniffer = new ImageSniffer()
      let held: Buffer[] | undefined = [] // first bytes, until they say PNG or JPEG
      for await (const chunk of image.file as AsyncIterable<Buffer>) {
        // busboy cuts the file at fileSize and marks it truncated: stop reading there.
        if (image.file.truncated) throw tooLarge()
        this.#imageHash.update(chunk)
        if (!sniffer.push(chunk)) throw validationError(NOT_AN_IMAGE)
        if (sniffer.mime === undefined) {
          held!.push(chunk)
          continue
        }
        if (held !== undefined) {
          out.push(this.writer.fileHead(IMAGE_FIELD, sniffer.mime), ...held)
          held = undefined
        }
        out.push(chunk)
        timing.handedOver()
        yield out.length === 1 ? out[0]! : Buffer.concat(out)
        timing.taken()
        out = []
      }
      if (image.file.truncated) throw tooLarge()
      if (sniffer.bytes === 0) throw validationError(`${IMAGE_FIELD} is empty`)
      if (sniffer.mime === undefined) throw validationError(NOT_AN_IMAGE)
      out.push(this.writer.fileTail)
      // The rest of the form, read and checked like the fields before the image.
      const another = await this.readUntilImage()
      if (another !== undefined) throw validationError(`${IMAGE_FIELD} must be given once`)
      out.push(...this.#encodedFields().slice(sentBeforeImage))
      this.#checkComplete()
    } catch (err) {
      throw clientError(err)
    }
    out.push(this.writer.end())
    timing.handedOver()
    yield Buffer.concat(out)
    timing.bodySent()
  }

  /**
   * What makes this form "the same request" (DECISIONS 16): the validated
   * fields sorted by name, and the image's digest. The boundary and the order
   * of the parts do not count. Valid once the whole form has been read.
   */
  contentDigest (): string {
    return JSON.stringify([[...this.#fields].sort(([a], [b]) => (a < b ? -1 : 1)), this.#imageHash.digest('base64url')])
  }

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
