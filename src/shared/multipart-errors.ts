/**
 * busboy reports a broken multipart body (no closing boundary, a bad part
 * header, a part cut short) as a bare Error with neither code nor status: the
 * client's fault, a 400. Errors with a code (fs, streams, @fastify/multipart)
 * and anything else are not, and must not be dressed up as one.
 * Shared by the gateway and the reference engine.
 */
export function isMalformedMultipart (err: unknown): err is Error {
  return err instanceof Error && err.constructor === Error && !('code' in err) && !('statusCode' in err)
}
