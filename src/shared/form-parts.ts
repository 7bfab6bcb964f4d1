/**
 * @fastify/multipart JSON-parses every `application/json` text part, and a broken one fails the form without naming
 * the field; read as streams, such parts stay text.
 */
import type { Readable } from 'node:stream'

export const PART_WITHOUT_NAME = 'form part has no name'

export function isPartAFile (
  _fieldName: string | undefined,
  contentType: string | undefined,
  fileName: string | undefined
): boolean {
  const type = contentType?.toLowerCase() ?? ''
  return fileName !== undefined || type === 'application/octet-stream' || type.startsWith('application/json')
}

/** At most `maxBytes`; the rest is skipped. */
export async function readTextPart (
  stream: Readable,
  maxBytes: number
): Promise<{ value: string, truncated: boolean }> {
  const chunks: Buffer[] = []
  let size = 0
  let truncated = false
  for await (const chunk of stream as AsyncIterable<Buffer>) {
    if (truncated) continue
    chunks.push(chunk)
    size += chunk.length
    if (size > maxBytes) truncated = true
  }
  return { value: Buffer.concat(chunks).subarray(0, maxBytes).toString('utf8'), truncated }
}
