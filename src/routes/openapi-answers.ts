/**
 * Every answer the gateway can send, operation by operation, as OpenAPI
 * response objects: what `openapi.json` declares and what the test suite
 * holds every answer it receives to (the document is the contract).
 *
 * Schemas, headers and responses that several operations share are
 * components, named once; an operation lists each status it can answer with.
 */
import { Type, type TSchema } from '@sinclair/typebox'
import { HealthError, SimpleError } from '../../schemas/errors.js'
import { RequestIdHeader, RetryAfterHeader } from '../../schemas/http-headers.js'
import { CreatePortfolioResponse, UpdatePortfolioResponse } from '../../schemas/portfolio.js'
import { CATALOGUE, type ErrorCode } from '../http/errors.js'

type Json = Record<string, unknown>

const schemaRef = (name: string): Json => ({ $ref: `#/components/schemas/${name}` })
const headerRef = (name: string): Json => ({ $ref: `#/components/headers/${name}` })
const responseRef = (name: string): Json => ({ $ref: `#/components/responses/${name}` })
const json = (schema: Json): Json => ({ 'application/json': { schema } })

/** The codes of the catalogue's entries with this status and shape: a status's `code` enum. */
const codesOf = (status: number, shape: 'simple' | 'structured'): ErrorCode[] =>
  (Object.keys(CATALOGUE) as ErrorCode[])
    .filter((code) => CATALOGUE[code].status === status && CATALOGUE[code].shape === shape)

/** A structured error whose `code` is one of `codes`: one schema per status, so clients narrow by it. */
function structuredError (codes: readonly string[], description: string): TSchema {
  return Type.Object({
    success: Type.Literal(false),
    error: Type.Object({
      source: Type.String({ description: 'The service that refused: portfolio-gateway, or the engine\'s name' }),
      code: Type.Union(codes.map((code) => Type.Literal(code))),
      message: Type.String({ description: 'What was wrong, naming the field when there is one' }),
      function: Type.String({ description: 'The handler: createPortfolio or updatePortfolio' })
    }, { additionalProperties: false })
  }, { additionalProperties: false, description })
}

/** The `code` enum of each structured-error schema: the document's, and what the engine may send under it. */
export const STRUCTURED_CODES: Record<string, readonly string[]> = {
  ValidationError: ['VALIDATION_ERROR'],
  NotFoundError: ['NOT_FOUND'],
  IdempotencyKeyInUseError: codesOf(409, 'structured'),
  IdempotencyKeyReusedError: ['IDEMPOTENCY_KEY_REUSED'],
  InternalError: ['INTERNAL_ERROR']
}

/** Schemas every answer below names, beside the ones the routes validate with (hoisted from the routes). */
export const ANSWER_SCHEMAS: Record<string, TSchema> = {
  SimpleError: { ...SimpleError, description: 'The simple shape: about the connection, the caller or the capacity' },
  HealthError,
  ValidationError: structuredError(STRUCTURED_CODES['ValidationError']!,
    'The request is invalid; the message names the field'),
  NotFoundError: structuredError(STRUCTURED_CODES['NotFoundError']!,
    'No such portfolio, or another user\'s (the engine\'s answer)'),
  IdempotencyKeyInUseError: structuredError(STRUCTURED_CODES['IdempotencyKeyInUseError']!,
    'A request with this key is in flight'),
  IdempotencyKeyReusedError: structuredError(STRUCTURED_CODES['IdempotencyKeyReusedError']!,
    'This key was used for another request'),
  InternalError: structuredError(STRUCTURED_CODES['InternalError']!,
    'An unexpected failure, of the gateway or the engine'),
  CreatePortfolioResponse,
  UpdatePortfolioResponse,
  OpenApiDocument: Type.Object({ openapi: Type.String() }, { additionalProperties: true, description: 'OpenAPI 3.1' })
}

/** Response headers, each with whether the answers that declare it always carry it. */
export const ANSWER_HEADERS: Record<string, Json> = {
  RequestId: {
    description: 'The request id: the client\'s x-request-id when 1-128 visible ASCII characters, else a new UUID',
    required: true,
    schema: { ...RequestIdHeader, description: undefined }
  },
  RetryAfter: {
    description: 'Whole seconds to wait before trying again (RFC 9110 10.2.3)',
    required: true,
    schema: { ...RetryAfterHeader, description: undefined }
  },
  RateLimit: {
    description: 'draft-ietf-httpapi-ratelimit-headers: what is left of the window and when it resets, e.g. ' +
      '"default";r=42;t=17. On every answer the per-user limit counted (not on a 401), while RATE_LIMIT_PER_MINUTE > 0',
    schema: { type: 'string' }
  },
  RateLimitPolicy: {
    description: 'draft-ietf-httpapi-ratelimit-headers: the limit, e.g. "default";q=600;w=60; sent with RateLimit',
    schema: { type: 'string' }
  },
  IdempotentReplayed: {
    description: 'true on the stored answer to a repeated Idempotency-Key; absent on a first answer',
    schema: { type: 'string', enum: ['true'] }
  },
  WwwAuthenticate: {
    description: 'RFC 6750 section 3: the bare challenge when no bearer token was sent (none, or another scheme ' +
      'such as Basic), error="invalid_token" when one was sent and refused',
    required: true,
    schema: { type: 'string', enum: ['Bearer', 'Bearer error="invalid_token"'] }
  }
}

const ID = { 'x-request-id': headerRef('RequestId') }
/** On /api/* answers the rate limit counted. */
const COUNTED = { ...ID, ratelimit: headerRef('RateLimit'), 'ratelimit-policy': headerRef('RateLimitPolicy') }
/** On the answers an Idempotency-Key record can replay: the engine's answers. */
const REPLAYABLE = { ...COUNTED, 'idempotent-replayed': headerRef('IdempotentReplayed') }
const RETRY = { ...COUNTED, 'retry-after': headerRef('RetryAfter') }

const simple = (description: string, headers: Json = ID): Json =>
  ({ description, headers, content: json(schemaRef('SimpleError')) })

/** Answers that several operations give alike. */
export const SHARED_ANSWERS: Record<string, Json> = {
  MalformedRequest: simple('Node\'s parser could not read the request (malformed request, missing Host header, ' +
    'a URL the router cannot read); the connection closes'),
  RequestTimeout: simple('The request\'s headers or body did not arrive in the server\'s time; the connection closes'),
  ChunkExtensionsTooLarge: simple('Chunk extensions too large (Node\'s parser); the connection closes'),
  ExpectationFailed: simple('An Expect header other than 100-continue'),
  HeadersTooLarge: simple('The request headers are too large (Node\'s parser); the connection closes'),
  Unauthorized: simple('No bearer token, or one refused: malformed, expired, not yet valid, badly signed, no sub, ' +
    'a wrong iss or aud. The message says which; WWW-Authenticate says whether a token was sent',
  { ...ID, 'www-authenticate': headerRef('WwwAuthenticate') }),
  RateLimited: simple('RATE_LIMITED: this user\'s requests per minute are used up; retry after Retry-After', RETRY),
  ServiceUnavailable: simple('Retry after Retry-After seconds: the gateway is overloaded (OVERLOADED, without ' +
    'RateLimit: refused before it counts), the identity provider cannot be reached (AUTH_PROVIDER_UNAVAILABLE, ' +
    'without RateLimit), the key store is away (IDEMPOTENCY_STORE_UNAVAILABLE), uploads hold their share of the ' +
    'engine (UPLOADS_BUSY), or the engine cannot serve it now or asks to slow down (UPSTREAM_RETRY_LATER, for ' +
    'the engine\'s 503 or 429, with its Retry-After in seconds, at most 3600)',
  RETRY),
  BadGateway: simple('The engine cannot be reached, or answered outside its contract (UPSTREAM_UNAVAILABLE, ' +
    'UPSTREAM_BAD_RESPONSE)', COUNTED),
  GatewayTimeout: simple('UPSTREAM_TIMEOUT: the engine did not answer in time', COUNTED),
  InternalErrorSimple: simple('INTERNAL_ERROR: an unexpected failure (no internals)'),
  IdempotencyKeyInUse: {
    description: 'IDEMPOTENCY_KEY_IN_USE: the first request with this key is still running. Retry-After is at most ' +
      'how long it may still run (an upload and the engine\'s deadline)',
    headers: RETRY,
    content: json(schemaRef('IdempotencyKeyInUseError'))
  },
  IdempotencyKeyReused: {
    description: 'IDEMPOTENCY_KEY_REUSED: this key was used for a different request (by this gateway or the engine)',
    headers: REPLAYABLE,
    content: json(schemaRef('IdempotencyKeyReusedError'))
  },
  PortfolioInternalError: {
    description: 'INTERNAL_ERROR: an unexpected failure of the gateway or the engine (no internals)',
    headers: REPLAYABLE,
    content: json(schemaRef('InternalError'))
  },
  PortfolioBadRequest: {
    description: 'VALIDATION_ERROR (structured): a field, the form, the body or the Idempotency-Key is invalid, ' +
      'from the gateway or the engine; or the simple shape when Node\'s parser could not read the request',
    headers: REPLAYABLE,
    content: json({ oneOf: [schemaRef('ValidationError'), schemaRef('SimpleError')] })
  }
}

/** What every operation can get from Node's parser and the front server, whatever its path. */
const PARSER_ANSWERS = {
  400: responseRef('MalformedRequest'),
  408: responseRef('RequestTimeout'),
  413: responseRef('ChunkExtensionsTooLarge'),
  417: responseRef('ExpectationFailed'),
  431: responseRef('HeadersTooLarge')
}

/** Every bearer route: before its handler. */
const BEARER_ANSWERS = {
  401: responseRef('Unauthorized'),
  429: responseRef('RateLimited'),
  503: responseRef('ServiceUnavailable')
}

/** Every route that calls the engine and passes its failure on. */
const ENGINE_ANSWERS = { 502: responseRef('BadGateway'), 504: responseRef('GatewayTimeout') }

export interface OperationDoc {
  operationId: string
  tag: 'health' | 'portfolios' | 'contract'
  summary: string
  description: string
  bearer: boolean
  responses: Record<number, Json>
}

/** Each documented route by "METHOD url"; a route not in this table is hidden. */
export const OPERATIONS: Record<string, OperationDoc> = {
  'GET /health': {
    operationId: 'getLiveness',
    tag: 'health',
    summary: 'Liveness',
    description: 'Whether this gateway process is up; 500 while it drains for shutdown. Never limited, never shed.',
    bearer: false,
    responses: {
      ...PARSER_ANSWERS,
      500: { description: 'The gateway is shutting down', headers: ID, content: json(schemaRef('HealthError')) }
    }
  },
  'GET /ping': {
    operationId: 'ping',
    tag: 'health',
    summary: 'The gateway answers',
    description: 'A round trip to the gateway only: no engine call, no token.',
    bearer: false,
    responses: { ...PARSER_ANSWERS, 500: responseRef('InternalErrorSimple') }
  },
  'GET /openapi.json': {
    operationId: 'getOpenApiDocument',
    tag: 'contract',
    summary: 'This document',
    description: 'The OpenAPI 3.1 document of the gateway, the same as openapi.json in its repository.',
    bearer: false,
    responses: {
      200: { description: 'This document', headers: ID, content: json(schemaRef('OpenApiDocument')) },
      ...PARSER_ANSWERS,
      500: responseRef('InternalErrorSimple')
    }
  },
  'GET /api/health': {
    operationId: 'getEngineHealth',
    tag: 'health',
    summary: 'The engine\'s health',
    description: 'The engine\'s database and cache as the engine reports them: always 200 while the token is good; ' +
      'degraded when the engine cannot be reached or reports a service down.',
    bearer: true,
    responses: {
      200: { description: 'The engine as it reports itself', headers: COUNTED, content: json(schemaRef('ApiHealth')) },
      ...PARSER_ANSWERS,
      ...BEARER_ANSWERS,
      500: simple('INTERNAL_ERROR: an unexpected failure', COUNTED)
    }
  },
  'GET /api/portfolio/ping': {
    operationId: 'pingEngine',
    tag: 'health',
    summary: 'Round trip to the engine',
    description: 'text/plain pong from the engine. Retried on another engine after a failure, within the deadline.',
    bearer: true,
    responses: {
      200: {
        description: 'The engine answered',
        headers: COUNTED,
        content: { 'text/plain': { schema: { type: 'string', const: 'pong' } } }
      },
      ...PARSER_ANSWERS,
      ...BEARER_ANSWERS,
      ...ENGINE_ANSWERS,
      500: {
        description: 'INTERNAL_ERROR: the engine\'s own structured error, or the gateway\'s in the simple shape',
        headers: COUNTED,
        content: json({ oneOf: [schemaRef('InternalError'), schemaRef('SimpleError')] })
      }
    }
  },
  'POST /api/portfolio/update': {
    operationId: 'updatePortfolio',
    tag: 'portfolios',
    summary: 'Replace a portfolio\'s target positions',
    description: 'Replaces the whole set of target positions of a portfolio of this user. Allocations are numbers in ' +
      '[0, 1] that sum to 1, no mint twice; the body is at most 64 KiB. With an Idempotency-Key a retry is answered ' +
      'from the stored answer.',
    bearer: true,
    responses: {
      200: {
        description: 'Target positions updated',
        headers: REPLAYABLE,
        content: json(schemaRef('UpdatePortfolioResponse'))
      },
      ...PARSER_ANSWERS,
      ...BEARER_ANSWERS,
      ...ENGINE_ANSWERS,
      400: responseRef('PortfolioBadRequest'),
      404: {
        description: 'NOT_FOUND: no such portfolio, or it belongs to another user (the same answer for both)',
        headers: REPLAYABLE,
        content: json(schemaRef('NotFoundError'))
      },
      409: responseRef('IdempotencyKeyInUse'),
      422: responseRef('IdempotencyKeyReused'),
      500: responseRef('PortfolioInternalError')
    }
  },
  'POST /api/portfolio/create': {
    operationId: 'createPortfolio',
    tag: 'portfolios',
    summary: 'Create a portfolio',
    description: 'A multipart form, streamed to the engine as it arrives; the portfolio starts in DRAFT with no ' +
      'positions. At most 2 creates per user at once; an upload that stalls or crawls is cut off (408). A form ' +
      'refused or abandoned halfway never creates a portfolio.',
    bearer: true,
    responses: {
      200: { description: 'Created', headers: REPLAYABLE, content: json(schemaRef('CreatePortfolioResponse')) },
      ...PARSER_ANSWERS,
      ...BEARER_ANSWERS,
      ...ENGINE_ANSWERS,
      400: responseRef('PortfolioBadRequest'),
      408: simple('UPLOAD_TIMEOUT: the upload sent no byte for 10 s, or under 4 KiB/s over 30 s; or the request\'s ' +
        'headers or body did not arrive in time (Node\'s parser). The connection closes', COUNTED),
      409: responseRef('IdempotencyKeyInUse'),
      422: responseRef('IdempotencyKeyReused'),
      429: simple('RATE_LIMITED: this user\'s requests per minute are used up; or TOO_MANY_UPLOADS: this user ' +
        'already has 2 creates in progress. Retry after Retry-After', RETRY),
      500: responseRef('PortfolioInternalError')
    }
  }
}

/**
 * Requests that match no operation: no route (404) or a known path with
 * another method (405, with Allow); Node's parser and the front server answer
 * them as they answer any request, and the load shedder refuses /api/* before
 * routing (503). No operation can declare them, so the document says them
 * here, in an extension generators skip.
 */
export const UNMATCHED_ANSWERS: Json = {
  ...PARSER_ANSWERS,
  503: simple('OVERLOADED: a request for /api/* refused by the load shedder before routing, whatever its path ' +
    'or method; retry after Retry-After', { ...ID, 'retry-after': headerRef('RetryAfter') }),
  404: { description: 'ROUTE_NOT_FOUND: no route has this path', headers: ID, content: json(schemaRef('SimpleError')) },
  405: {
    description: 'METHOD_NOT_ALLOWED: this path is served, with other methods (RFC 9110 15.5.6)',
    headers: {
      ...ID,
      allow: { description: 'The path\'s methods, e.g. GET, HEAD', required: true, schema: { type: 'string' } }
    },
    content: json(schemaRef('SimpleError'))
  }
}

/** The structured-error schema names a response object's JSON body may take ($ref or oneOf of $refs). */
function structuredSchemasOf (response: Json): string[] {
  const ref = response.$ref
  if (typeof ref === 'string') return structuredSchemasOf(SHARED_ANSWERS[ref.split('/').pop()!] ?? {})
  const schema = ((response.content as Json | undefined)?.['application/json'] as Json | undefined)?.schema as
    Json | undefined
  const refs = schema === undefined ? [] : (schema.oneOf as Json[] | undefined) ?? [schema]
  return refs.map((r) => String(r.$ref).split('/').pop()!).filter((name) => STRUCTURED_CODES[name] !== undefined)
}

/**
 * The codes the document declares for each of `statuses` of an operation
 * (`"METHOD url"`): the engine's structured errors that may pass through,
 * read from the same table the document is built from.
 */
export function declaredErrorCodes (
  operation: string, statuses: readonly number[]
): ReadonlyMap<number, ReadonlySet<string>> {
  const responses = OPERATIONS[operation]?.responses
  if (responses === undefined) throw new Error(`no operation ${operation} in the document`)
  return new Map(statuses.map((status) => {
    const codes = structuredSchemasOf(responses[status] ?? {}).flatMap((name) => STRUCTURED_CODES[name]!)
    // A status the document does not declare with a structured body cannot pass: fail at load, not per request.
    if (codes.length === 0) throw new Error(`${operation} declares no structured error for ${status}`)
    return [status, new Set(codes)]
  }))
}

/** The engine's structured errors that a create passes on, by status: the codes the document declares for each. */
export const CREATE_ENGINE_ERRORS = declaredErrorCodes('POST /api/portfolio/create', [400, 422, 500])
/** An update can also name a portfolio that is not there (decision: unknown portfolio). */
export const UPDATE_ENGINE_ERRORS = declaredErrorCodes('POST /api/portfolio/update', [400, 404, 422, 500])
/** A ping has no input to refuse. */
export const PING_ENGINE_ERRORS = declaredErrorCodes('GET /api/portfolio/ping', [500])
