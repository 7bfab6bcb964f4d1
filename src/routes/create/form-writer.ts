/** The create form for the engine (RFC 7578), written from checked values so no header the client chose reaches it. */
import { randomBytes } from 'node:crypto'
import { imageExtension, type ImageMime } from '../../shared/image-type.js'

export class MultipartWriter {
  readonly boundary = `----portfolio-gateway-${randomBytes(16).toString('hex')}`
  readonly contentType = `multipart/form-data; boundary=${this.boundary}`

  field (name: string, value: string): Buffer {
    return Buffer.from(`--${this.boundary}\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n${value}\r\n`)
  }

  fileHead (name: string, mime: ImageMime): Buffer {
    return Buffer.from(`--${this.boundary}\r\nContent-Disposition: form-data; name="${name}"; ` +
      `filename="${name}.${imageExtension(mime)}"\r\nContent-Type: ${mime}\r\n\r\n`)
  }

  readonly fileTail = Buffer.from('\r\n')

  end (): Buffer {
    return Buffer.from(`--${this.boundary}--\r\n`)
  }
}
