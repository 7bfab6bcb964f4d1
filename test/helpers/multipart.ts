/**
 * Builds multipart/form-data bodies by hand (RFC 7578), so tests control every
 * byte: field order, declared types, and where a truncated upload stops.
 */
import { randomBytes } from 'node:crypto'

/** `name` undefined: a part whose Content-Disposition has no name; a text part may declare a content type. */
export type MultipartPart =
  | { name: string | undefined, value: string, contentType?: string }
  | { name: string | undefined, filename: string, contentType: string, data: Buffer }

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
