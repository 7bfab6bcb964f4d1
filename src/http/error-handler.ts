/** Every failure leaves in one of the interface's shapes, and no 5xx carries internals. */
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { clientErrorMessage } from '../shared/client-errors.js'
import { GatewayError, validationError, wireBody } from './errors.js'
import { describeIssues, type SchemaIssue } from '../shared/validation-messages.js'
import { routerPath } from './router-path.js'

import type {} from '../shared/route-config.js'

/** Turn whatever was thrown into a GatewayError. */
export function toGatewayError (err: FastifyError | Error, request?: FastifyRequest): GatewayError {
  if (err instanceof GatewayError) return err
  const fe = err as FastifyError
  if (fe.validation !== undefined && fe.validation.length > 0) {
    return validationError(describeIssues(fe.validation as unknown as SchemaIssue[], fe.validationContext ?? 'body'))
  }
  const rewritten = fe.code === undefined ? undefined : clientErrorMessage(fe.code, request?.routeOptions.bodyLimit)
  if (rewritten !== undefined) return validationError(rewritten)
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
    if (failure.statusCode === 503) {
      // Our own 503s are capacity signals, logged where the state changes: a stack per refused request would bury
      // the reader in identical traces during a Redis failover.
      request.log.warn({ code: failure.code, reason: failure.message }, 'request refused, retry later')
    } else if (failure.statusCode >= 500) {
      request.log.error({ err: failure.cause ?? err, code: failure.code }, failure.message)
    } else {
      request.log.info({ code: failure.code, reason: failure.message }, 'request rejected')
    }
    return reply
      .code(failure.statusCode)
      .headers(failure.headers)
      .send(wireBody(failure, request.routeOptions.config.handler))
  })

  // Each path's methods, as routes are added: a known path asked with another method is 405 (RFC 9110 15.5.6).
  const methodsByPath = new Map<string, string[]>()
  app.addHook('onRoute', (route) => {
    const methods = methodsByPath.get(route.url) ?? []
    for (const method of [route.method].flat()) if (!methods.includes(method)) methods.push(method)
    methodsByPath.set(route.url, methods)
  })

  // In onRequest, before any body is read: a not-found handler runs only after Fastify parsed it.
  app.addHook('onRequest', function routeNotFound (request, _reply, done) {
    if (!request.is404) return done()
    const path = request.url.split('?')[0]!
    // The path as the router read it (percent-decoded, from an absolute target), so /%61pi/x is /api/x here too.
    const allowed = methodsByPath.get(routerPath(request.url) ?? path)
    // The path is the client's own; cut so a long one cannot bloat the answer or the log.
    if (allowed === undefined) {
      return done(new GatewayError('ROUTE_NOT_FOUND', `no route ${request.method} ${path.slice(0, 200)}`))
    }
    const allow = allowed.join(', ')
    const message = `${request.method.slice(0, 20)} not allowed on ${path}: use ${allow}`
    done(new GatewayError('METHOD_NOT_ALLOWED', message, { headers: { allow } }))
  })
}
