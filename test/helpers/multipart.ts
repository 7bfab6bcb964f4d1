/**
 * Builds multipart/form-data bodies by hand (RFC 7578), so tests control every
 * byte: field order, declared types, and where a truncated upload stops.
 */
import { randomBytes } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { PNG_IMAGE } from '../../fixtures/images.js'

/** `name` undefined: a part whose Content-Disposition has no name; a text part may declare a content type. */
export type MultipartPart =
  | { name: string | undefined, value: string, contentType?: string } |
  { name: string | undefined, filename: string, contentType: string, data: Buffer }

const CRLF = '\r\n'

/** HTML's form encoding: quotes and line breaks in names are percent-escaped. */
function quoted (text: string): string {
  return `"${text.replace(/"/g, '%22').replace(/\r/g, '%0D').replace(/\n/g, '%0A')}"`
}

export function multipartBody (parts: MultipartPart[], boundary = `----portfolio-test-${randomBytes(12).toString('hex')}`): { body: Buffer, contentType: string } {
  const chunks: Buffer[] = []
  for (const part of parts) {
    let head = `--${boundary}${CRLF}Content-Disposition: form-data${part.name === undefined ? '' : `; name=${quoted(part.name)}`}`
    if ('filename' in part) head += `; filename=${quoted(part.filename)}`
    if (part.contentType !== undefined) head += `${CRLF}Content-Type: ${part.contentType}`
    chunks.push(Buffer.from(head + CRLF + CRLF))
    chunks.push('data' in part ? part.data : Buffer.from(part.value, 'utf8'))
    chunks.push(Buffer.from(CRLF))
  }
  chunks.push(Buffer.from(`--${boundary}--${CRLF}`))
  return { body: Buffer.concat(chunks), contentType: `multipart/form-data; boundary=${boundary}` }
}

/** The create form's pieces, shared by the create tests. */
const PNG = readFileSync(PNG_IMAGE)
/** A valid create form's text fields. */
export const CREATE_FIELDS: MultipartPart[] = [{ name: 'name', value: 'Blue chips' }, { name: 'type', value: 'PORTFOLIO' }]
export const imagePart = (data: Buffer, contentType = 'image/png', filename = 'a.png'): MultipartPart => ({ name: 'image', filename, contentType, data })
/** `size` bytes that the gateway takes for a PNG: its signature, then filler. */
export function pngOfSize (size: number): Buffer {
  const data = Buffer.alloc(size, 0x42)
  PNG.copy(data, 0, 0, 8)
  return data
}
/** The gateway's 400 for a bad create form. */
export const createValidationError = (message: string): unknown => ({
  success: false,
  error: { source: 'portfolio-gateway', code: 'VALIDATION_ERROR', message, function: 'createPortfolio' }
})
