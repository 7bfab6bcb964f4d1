/**
 * Encodes the create form for the engine (RFC 7578). The gateway writes its own
 * parts from checked values: field names from the schema, a fixed file name
 * and the sniffed type, so nothing the client chose for headers reaches the engine.
 */
import { randomBytes } from 'node:crypto'
import { imageExtension, type ImageMime } from '../../shared/image-type.js'

export class MultipartWriter {
  readonly boundary = `----portfolio-gateway-${randomBytes(16).toString('hex')}`
  readonly contentType = `multipart/form-data; boundary=${this.boundary}`

  field (name: string, value: string): Buffer {
    return Buffer.from(`--${this.boundary}\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n${value}\r\n`)
  }

  fileHead (name: string, mime: ImageMime): Buffer {
    return Buffer.from(`--${this.boundary}\r\nContent-Disposition: form-data; name="${name}"; filename="${name}.${imageExtension(mime)}"\r\nContent-Type: ${mime}\r\n\r\n`)
  }

  /** Ends the file part's bytes. */
  readonly fileTail = Buffer.from('\r\n')

  end (): Buffer {
    return Buffer.from(`--${this.boundary}--\r\n`)
  }
}
