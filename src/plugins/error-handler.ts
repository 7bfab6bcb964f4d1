/**
 * The one error handler: every failure leaves as one of the interface's
 * shapes, and no 5xx carries internals (stack, message of a bug, engine text).
 */
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { CREATE_FORM_LIMITS, IMAGE_FIELD } from '../../schemas/portfolio.js'
import { GatewayError, validationError, wireBody } from '../errors.js'
import { describeIssues, type SchemaIssue } from '../validation.js'

declare module 'fastify' {
  interface FastifyContextConfig {
    /** Handler name for `error.function` in structured errors; unset: simple errors. */
    handler?: string
  }
}

/** Fastify's own client errors, rewritten as VALIDATION_ERROR messages a client can act on. */
const FASTIFY_CLIENT_ERRORS: Record<string, (request?: FastifyRequest) => string> = {
  FST_ERR_CTP_BODY_TOO_LARGE: (request) => `body must be at most ${request?.routeOptions.bodyLimit ?? 'the accepted number of'} bytes`,
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

/** Turn whatever was thrown into a GatewayError. */
export function toGatewayError (err: FastifyError | Error, request?: FastifyRequest): GatewayError {
  if (err instanceof GatewayError) return err
  const fe = err as FastifyError
  if (fe.validation !== undefined && fe.validation.length > 0) {
    return validationError(describeIssues(fe.validation as unknown as SchemaIssue[], fe.validationContext ?? 'body'))
  }
  const rewrite = fe.code === undefined ? undefined : FASTIFY_CLIENT_ERRORS[fe.code]
  if (rewrite !== undefined) return validationError(rewrite(request))
  // secure-json-parse throws a SyntaxError with statusCode 400 for malformed JSON.
  if (err instanceof SyntaxError && fe.statusCode === 400) return validationError('body is not valid JSON')
  if (typeof fe.statusCode === 'number' && fe.statusCode >= 400 && fe.statusCode < 500) {
    return validationError(fe.message)
  }
  return new GatewayError('INTERNAL_ERROR', undefined, { cause: err })
}

export function installErrorHandling (app: FastifyInstance): void {
  app.setErrorHandler(function handleError (err: FastifyError, request: FastifyRequest, reply: FastifyReply) {
    const failure = toGatewayError(err, request)
    if (failure.statusCode >= 500) {
      request.log.error({ err: failure.cause ?? err, code: failure.code }, failure.message)
    } else {
      request.log.info({ code: failure.code, reason: failure.message }, 'request rejected')
    }
    return reply.code(failure.statusCode).send(wireBody(failure, request.routeOptions.config.handler))
  })

  app.setNotFoundHandler(function routeNotFound (request: FastifyRequest, reply: FastifyReply) {
    // The path is the client's own; cut so a long one cannot bloat the answer or the log.
    const failure = new GatewayError('ROUTE_NOT_FOUND', `no route ${request.method} ${request.url.split('?')[0]!.slice(0, 200)}`)
    request.log.info({ code: failure.code, reason: failure.message }, 'request rejected')
    return reply.code(404).send(wireBody(failure, undefined))
  })
}
