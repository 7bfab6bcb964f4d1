/** Fastify's and @fastify/multipart's client errors as messages a client can act on. */
import { CREATE_FORM_LIMITS, IMAGE_FIELD } from '../../schemas/portfolio.js'

const MESSAGES: Readonly<Record<string, (bodyLimit: number | undefined) => string>> = {
  FST_ERR_CTP_BODY_TOO_LARGE: (bodyLimit) => `body must be at most ${bodyLimit ?? 'the accepted number of'} bytes`,
  FST_ERR_CTP_INVALID_MEDIA_TYPE: () => 'content-type is not accepted by this endpoint',
  FST_ERR_CTP_EMPTY_JSON_BODY: () => 'body must not be empty',
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: () => 'content-length does not match the body',
  FST_ERR_CTP_INVALID_JSON_BODY: () => 'body is not valid JSON',
  // @fastify/multipart
  FST_INVALID_MULTIPART_CONTENT_TYPE: () => 'content-type must be multipart/form-data',
  FST_PARTS_LIMIT: () => `form must have at most ${CREATE_FORM_LIMITS.parts} parts`,
  FST_FIELDS_LIMIT: () => `form must have at most ${CREATE_FORM_LIMITS.fields} text fields`,
  FST_FILES_LIMIT: () => `form must have at most ${CREATE_FORM_LIMITS.files} file (${IMAGE_FIELD})`,
  FST_REQ_FILE_TOO_LARGE: () => `${IMAGE_FIELD} must be at most ${CREATE_FORM_LIMITS.fileSize} bytes`,
  FST_PROTO_VIOLATION: () => 'form field names must not be prototype properties',
  FST_MP_PREMATURE_CLOSE: () => 'multipart body ended before the form was complete'
}

export function clientErrorMessage (code: string, bodyLimit?: number): string | undefined {
  return MESSAGES[code]?.(bodyLimit)
}
