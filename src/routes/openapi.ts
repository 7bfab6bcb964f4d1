/**
 * GET /openapi.json, generated from the schemas that validate (decision: the contract as a document). Answers,
 * headers and the create form are added in the generator's `transform`, so they document and change nothing: a
 * body schema on create would make Fastify read the streamed body itself.
 */
import fastifySwagger from '@fastify/swagger'
import { Type, type TSchema } from '@sinclair/typebox'
import type { FastifyInstance, RouteOptions } from 'fastify'
import { IdempotencyKeyHeader, RequestIdParameter, TraceParentParameter } from '../../schemas/http-headers.js'
import { CreatePortfolioFields, IMAGE_FIELD, LIMITS } from '../../schemas/portfolio.js'
import { REQUEST_ID_HEADER } from '../../schemas/upstream.js'
import { TRACEPARENT_HEADER } from '../observability/trace-context.js'
import { IMAGE_TYPE_NAMES } from '../shared/image-type.js'
import { ANSWER_HEADERS, ANSWER_SCHEMAS, OPERATIONS, SHARED_ANSWERS, UNMATCHED_ANSWERS } from './openapi-answers.js'

export const OPENAPI_PATH = '/openapi.json'
const BEARER_SCHEME = 'bearerAuth'

/**
 * A schema that becomes a named component: @fastify/swagger drops a top-level
 * `$id`, so the title carries the name and `hoistNamedSchemas` does the rest.
 */
const named = <T extends TSchema>(schema: T): T =>
  typeof schema.$id === 'string' ? { ...schema, title: schema.$id } : schema

const TRACE_HEADERS = {
  [REQUEST_ID_HEADER]: Type.Optional(RequestIdParameter),
  [TRACEPARENT_HEADER]: Type.Optional(TraceParentParameter)
}
const IDEMPOTENT_HEADERS = { ...TRACE_HEADERS, 'idempotency-key': Type.Optional(IdempotencyKeyHeader) }

/** The create form as the document shows it: the fields' own schemas, plus the image. */
const CreatePortfolioForm = Type.Object({
  [IMAGE_FIELD]: Type.Optional(Type.String({
    format: 'binary',
    contentMediaType: 'application/octet-stream',
    description: `${IMAGE_TYPE_NAMES}, recognised by its bytes, at most ${LIMITS.imageMaxBytes} bytes; optional`
  })),
  ...CreatePortfolioFields.properties
}, {
  $id: 'CreatePortfolioForm',
  additionalProperties: false,
  description: 'Each field at most once; the parts are checked as they stream, before the engine is called'
})

/** The request side of each route beyond its validating schema: headers, and create's form. */
const REQUESTS: Record<string, { headers: Record<string, TSchema>, body?: TSchema }> = {
  'POST /api/portfolio/update': { headers: IDEMPOTENT_HEADERS },
  'POST /api/portfolio/create': { headers: IDEMPOTENT_HEADERS, body: CreatePortfolioForm }
}

/** @fastify/swagger `transform`: the route's own request schemas plus its headers; answers come later (`document`). */
function documentRoute (
  { schema, url, route }: { schema: RouteOptions['schema'], url: string, route: RouteOptions }
): { schema: Record<string, unknown>, url: string } {
  const method = Array.isArray(route.method) ? route.method[0] : route.method
  const key = `${String(method)} ${url}`
  if (OPERATIONS[key] === undefined) return { schema: { ...schema, hide: true }, url }
  const request = REQUESTS[key]
  // The answers are the document's own (openapi-answers.ts): the route's response schemas serialize, nothing more.
  const { response: _serializers, ...own } = schema ?? {}
  return {
    url,
    schema: {
      ...own,
      headers: request?.headers ?? TRACE_HEADERS,
      ...(schema?.body === undefined ? {} : { body: named(schema.body as TSchema) }),
      ...(request?.body === undefined ? {} : { body: named(request.body), consumes: ['multipart/form-data'] }),
      // The 200 bodies the routes serialize with, named, for `document` to point at.
      response: Object.fromEntries(Object.entries((schema?.response ?? {}) as Record<string, TSchema>)
        .filter(([status]) => status === '200').map(([status, body]) => [status, named(body)]))
    }
  }
}

/** Not a plugin, and registered first: @fastify/swagger must sit on the root instance to see every route. */
export async function registerOpenApi (app: FastifyInstance): Promise<void> {
  await app.register(fastifySwagger, {
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'Portfolio Gateway',
        // The interface this document describes (spec title).
        version: '1.2.0',
        description: 'The Portfolio Service Interface v1.2.0 at the edge. Every answer carries x-request-id and is ' +
          'one of three shapes: SimpleError, a structured error (success: false, with a code), or HealthError. ' +
          'Every status an operation can answer is listed under it, including those of the HTTP parser. A request ' +
          'that matches no operation is answered as x-unmatched-requests says: 404 for an unknown path, 405 with ' +
          'Allow for a known path with another method, 503 when the gateway sheds /api/* load, and the parser\'s.',
        license: { name: 'Proprietary', identifier: 'LicenseRef-Proprietary' }
      },
      // Relative: the origin the document was fetched from; a client sets its deployment's own.
      servers: [{ url: '/', description: 'The gateway that serves this document' }],
      tags: [
        { name: 'health', description: 'Liveness of the gateway, and the engine behind it' },
        { name: 'portfolios', description: 'Create portfolios and set their target positions' },
        { name: 'contract', description: 'This document' }
      ],
      components: {
        securitySchemes: { [BEARER_SCHEME]: { type: 'http', scheme: 'bearer', bearerFormat: 'JWT' } }
      }
    },
    // Named components (SimpleError, ...) instead of def-0, def-1.
    refResolver: {
      buildLocalReference (json, _baseUri, _fragment, i) {
        return typeof json.$id === 'string' ? json.$id : `def-${i}`
      }
    },
    transform: documentRoute,
    transformObject: (document) => 'openapiObject' in document
      ? withAnswers(hoistNamedSchemas(document.openapiObject as Json))
      : document.swaggerObject
  })
  // The routes are fixed once the app is ready: serialize the document once.
  let text: string | undefined
  app.get(OPENAPI_PATH, async (_request, reply) => {
    return reply.type('application/json; charset=utf-8').send(text ??= JSON.stringify(app.swagger()))
  })
}

type Json = Record<string, unknown>

/** Titled schemas become components, so a generated client names SimpleError instead of repeating it inline. */
function hoistNamedSchemas (document: Json): Json {
  const components = (document.components ?? {}) as Json
  const schemas: Record<string, Json> = { ...(components.schemas as Record<string, Json> | undefined) }
  const visit = (value: unknown): unknown => {
    if (Array.isArray(value)) return value.map(visit)
    if (typeof value !== 'object' || value === null) return value
    const object = value as Json
    const out: Json = {}
    for (const [key, child] of Object.entries(object)) out[key] = visit(child)
    if (typeof out.title === 'string' && out.type === 'object') {
      const { description, ...schema } = out
      schemas[out.title] ??= schema
      return { $ref: `#/components/schemas/${out.title}`, ...(description === undefined ? {} : { description }) }
    }
    return out
  }
  const paths = visit(document.paths)
  const sorted = Object.fromEntries(Object.entries(schemas).sort(([a], [b]) => a.localeCompare(b)))
  return { ...document, paths, components: { ...components, schemas: sorted } }
}

function withAnswers (document: Json): Json {
  const paths = document.paths as Record<string, Record<string, Json>>
  for (const [path, operations] of Object.entries(paths)) {
    for (const [method, operation] of Object.entries(operations)) {
      const doc = OPERATIONS[`${method.toUpperCase()} ${path}`]!
      const ok = (operation.responses as Record<string, Json> | undefined)?.['200']
      const own = ok?.content as Record<string, { schema: Json }> | undefined
      const responses: Record<string, unknown> = { ...doc.responses }
      // A route's own 200 schema (the one it serializes with) is its 200 body, unless the table gives the whole answer.
      if (responses['200'] === undefined && own !== undefined) {
        const headers = { 'x-request-id': { $ref: '#/components/headers/RequestId' } }
        responses['200'] = { description: 'OK', headers, content: own }
      }
      operations[method] = {
        operationId: doc.operationId,
        tags: [doc.tag],
        summary: doc.summary,
        description: doc.description,
        ...operation,
        security: doc.bearer ? [{ [BEARER_SCHEME]: [] }] : [],
        responses: Object.fromEntries(Object.entries(responses).sort(([a], [b]) => a.localeCompare(b)))
      }
    }
  }
  const components = document.components as Json
  const schemas = { ...(components.schemas as Json), ...JSON.parse(JSON.stringify(ANSWER_SCHEMAS)) as Json }
  return {
    ...document,
    paths,
    components: {
      ...components,
      schemas: Object.fromEntries(Object.entries(schemas).sort(([a], [b]) => a.localeCompare(b))),
      headers: ANSWER_HEADERS,
      responses: SHARED_ANSWERS
    },
    'x-unmatched-requests': UNMATCHED_ANSWERS
  }
}
