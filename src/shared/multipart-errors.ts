/** busboy reports a broken multipart body as a bare Error without code or status; errors with one are not 400s. */
export function isMalformedMultipart (err: unknown): err is Error {
  return err instanceof Error && err.constructor === Error && !('code' in err) && !('statusCode' in err)
}
