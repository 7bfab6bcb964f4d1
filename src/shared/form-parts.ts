/**
 * How a create form's parts are told apart, for the gateway and the reference
 * engine alike.
 *
 * @fastify/multipart JSON-parses every text part sent with
 * `content-type: application/json` (and has no option to stop it): the value
 * would arrive as an object, and a broken one fails the whole form without
 * naming the field. busboy's `isPartAFile` decides which parts are streams;
 * making those parts streams keeps them away from that parser, and
 * readTextPart reads them as the text they are, bounded like any field.
 */
import type { Readable } from 'node:stream'

export const PART_WITHOUT_NAME = 'form part has no name'

/** busboy's test, plus: a part declared as JSON is read as a stream of text, never parsed. */
export function isPartAFile (
  _fieldName: string | undefined,
  contentType: string | undefined,
  fileName: string | undefined
): boolean {
  const type = contentType?.toLowerCase() ?? ''
  return fileName !== undefined || type === 'application/octet-stream' || type.startsWith('application/json')
}

/** A text part that came as a stream: at most `maxBytes` of it, and whether there was more (then the rest is skipped).
 *
 */
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
