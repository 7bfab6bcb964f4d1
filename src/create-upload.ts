/**
 * Reading the create form while it streams (issue: validated multipart
 * uploads). Text fields are checked one by one as they arrive; the image is
 * checked by its first bytes and its size as it passes; the engine gets a form
 * re-encoded by MultipartWriter. Memory per upload: the chunk in hand.
 */
import type { MultipartFile, Multipart } from '@fastify/multipart'
import type { FastifyRequest } from 'fastify'
import { CREATE_FORM_LIMITS, CreatePortfolioField, CreatePortfolioFields, IMAGE_FIELD } from '../schemas/portfolio.js'
import { GatewayError, validationError } from './errors.js'
import { ImageSniffer, NOT_AN_IMAGE } from './image-type.js'
import { MultipartWriter } from './multipart-writer.js'
import { toGatewayError } from './plugins/error-handler.js'
import { describeIssues, type SchemaIssue } from './validation.js'

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

/** Anything that goes wrong while reading the client's body is the client's: a 400. */
function clientError (err: unknown): GatewayError {
  const mapped = toGatewayError(err as Error)
  return mapped.statusCode === 500 ? validationError('multipart body is malformed or truncated') : mapped
}

export class CreateUpload {
  readonly writer = new MultipartWriter()
  readonly #fields = new Map<string, string>()
  readonly #parts: AsyncIterator<Multipart>
  readonly #checkField: Validate
  readonly #checkForm: Validate

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
          if (part.fieldname !== IMAGE_FIELD) throw validationError(`${part.fieldname} is not an accepted file field (only ${IMAGE_FIELD})`)
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
   */
  async * streamBody (image: MultipartFile, timing: UploadTiming): AsyncGenerator<Buffer> {
    const send = async function * (chunk: Buffer): AsyncGenerator<Buffer> {
      timing.handedOver()
      yield chunk
      timing.taken()
    }
    try {
      for (const chunk of this.#encodedFields()) yield * send(chunk)
      yield * this.#imagePart(image, send)
      for (;;) {
        const next = await this.#parts.next()
        if (next.done === true) break
        const part = next.value
        if (part.type === 'file') throw validationError(`${part.fieldname} is not an accepted file field (only one ${IMAGE_FIELD})`)
        this.#acceptField(part.fieldname, part.value, part.valueTruncated)
        yield * send(this.writer.field(part.fieldname, String(part.value)))
      }
      this.#checkComplete()
    } catch (err) {
      throw clientError(err)
    }
    timing.handedOver()
    yield this.writer.end()
    timing.bodySent()
  }

  async * #imagePart (image: MultipartFile, send: (chunk: Buffer) => AsyncGenerator<Buffer>): AsyncGenerator<Buffer> {
    const sniffer = new ImageSniffer()
    const held: Buffer[] = []
    let headSent = false
    for await (const chunk of image.file as AsyncIterable<Buffer>) {
      // busboy cuts the file at fileSize and marks it truncated: stop reading there.
      if (image.file.truncated) throw tooLarge()
      if (!sniffer.push(chunk)) throw validationError(NOT_AN_IMAGE)
      if (sniffer.mime === undefined) {
        held.push(chunk) // fewer than 8 bytes so far: the part header needs the type
        continue
      }
      if (!headSent) {
        headSent = true
        yield * send(this.writer.fileHead(IMAGE_FIELD, sniffer.mime))
        for (const h of held.splice(0)) yield * send(h)
      }
      yield * send(chunk)
    }
    if (image.file.truncated) throw tooLarge()
    if (sniffer.bytes === 0) throw validationError(`${IMAGE_FIELD} is empty`)
    if (sniffer.mime === undefined) throw validationError(NOT_AN_IMAGE)
    yield * send(this.writer.fileTail)
  }

  #acceptField (name: string, value: unknown, truncated: boolean): void {
    if (name === IMAGE_FIELD) throw validationError(`${IMAGE_FIELD} must be a file`)
    if (this.#fields.has(name)) throw validationError(`${name} must be given once`)
    if (!this.#checkField({ [name]: value })) throw validationError(describeIssues(this.#checkField.errors as SchemaIssue[], 'form'))
    // A value cut at fieldSize is longer than any field allows; the schema has said so above.
    if (truncated) throw validationError(`${name} is longer than ${CREATE_FORM_LIMITS.fieldSize} bytes`)
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
