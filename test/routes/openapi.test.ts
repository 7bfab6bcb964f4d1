/**
 * GET /openapi.json (DECISIONS 19): served publicly, a valid OpenAPI 3.1
 * document (checked by a real validator), the same as the committed copy, and
 * saying what DECISIONS 19 says, route by route.
 */
import { readFile } from 'node:fs/promises'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { Validator } from '@seriousme/openapi-schema-validator'
import openapiTS, { astToString, COMMENT_HEADER } from 'openapi-typescript'
import t from 'tap'
import { request } from 'undici'
import { openApiDocument } from '../../src/cli/openapi-document.js'
import { IMAGE_TYPE_NAMES, NOT_AN_IMAGE } from '../../src/shared/image-type.js'
import { build } from '../helpers/app.js'
import { ROOT } from '../helpers/processes.js'

const COMMITTED = pathToFileURL(join(ROOT, 'openapi.json'))

interface Operation {
  security?: unknown
  parameters?: Array<{ name: string; in: string }>
  requestBody?: { content: Record<string, { schema: unknown }> }
  responses: Record<
    string,
    { content?: Record<string, { schema: { $ref?: string } }>; headers?: Record<string, unknown> }
  >
}
interface Document {
  openapi: string
  paths: Record<string, Record<string, Operation>>
  components: {
    schemas: Record<
      string,
      { type?: string; properties?: Record<string, { type?: string; format?: string }>; required?: string[] }
    >
    securitySchemes: unknown
  }
}

t.test('served on the public port without a token, as JSON', async (t) => {
  const { url } = await build(t)
  const res = await request(`${url}/openapi.json`)
  t.equal(res.statusCode, 200)
  t.equal(res.headers['content-type'], 'application/json; charset=utf-8')
  t.ok(res.headers['x-request-id'])
  const served = (await res.body.json()) as Document
  t.same(served, JSON.parse(await readFile(COMMITTED, 'utf8')), 'what is served is what is committed')
})

t.test('openapi.json is in step with the schemas (npm run openapi regenerates it)', async (t) => {
  t.equal(
    await openApiDocument(),
    await readFile(COMMITTED, 'utf8'),
    'run `npm run openapi` and commit openapi.json and client/schema.ts'
  )
})

t.test('client/schema.ts is in step with openapi.json', async (t) => {
  // What `openapi-typescript openapi.json -o client/schema.ts` (npm run openapi) writes.
  const generated = COMMENT_HEADER + astToString(await openapiTS(COMMITTED))
  t.equal(
    generated,
    await readFile(join(ROOT, 'client', 'schema.ts'), 'utf8'),
    'run `npm run openapi` and commit client/schema.ts'
  )
})

t.test('a valid OpenAPI 3.1 document', async (t) => {
  const validator = new Validator()
  const result = await validator.validate(
    JSON.parse(await readFile(COMMITTED, 'utf8')) as Parameters<Validator['validate']>[0]
  )
  t.same(result.errors, undefined, 'no errors')
  t.equal(result.valid, true)
  t.equal(validator.version, '3.1')
})

t.test('every operation: its name, its security and every status it can answer', async (t) => {
  const doc = JSON.parse(await readFile(COMMITTED, 'utf8')) as Document & {
    components: { responses: Record<string, unknown> }
  }
  const statuses = (op: Operation) => Object.keys(op.responses).map(Number)
  const parser = [400, 408, 413, 417, 431]
  const bearer = [401, 429, 503]
  const engine = [502, 504]
  const sorted = (list: number[]) => [...new Set(list)].sort((a, b) => a - b)
  const expected: Record<string, [string, number[]]> = {
    'GET /health': ['getLiveness', [200, ...parser, 500]],
    'GET /ping': ['ping', [200, ...parser, 500]],
    'GET /openapi.json': ['getOpenApiDocument', [200, ...parser, 500]],
    'GET /api/health': ['getEngineHealth', [200, ...parser, ...bearer, 500]],
    'GET /api/portfolio/ping': ['pingEngine', [200, ...parser, ...bearer, ...engine, 500]],
    'POST /api/portfolio/update': ['updatePortfolio', [200, ...parser, ...bearer, ...engine, 404, 409, 422, 500]],
    'POST /api/portfolio/create': ['createPortfolio', [200, ...parser, ...bearer, ...engine, 409, 422, 500]]
  }
  const seen: string[] = []
  for (const [path, methods] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(methods)) {
      const where = `${method.toUpperCase()} ${path}`
      seen.push(where)
      const [operationId, codes] = expected[where] ?? ['?', []]
      t.equal((op as Operation & { operationId: string }).operationId, operationId, `${where}: operationId`)
      t.same(statuses(op), sorted(codes), `${where}: its statuses`)
      t.same(
        op.security,
        path.startsWith('/api/') ? [{ bearerAuth: [] }] : [],
        `${where}: bearer on /api/* only, public elsewhere`
      )
      const headers = (op.parameters ?? []).filter((p) => p.in === 'header').map((p) => p.name)
      const idempotent = path === '/api/portfolio/create' || path === '/api/portfolio/update'
      t.same(
        headers,
        ['x-request-id', 'traceparent', ...(idempotent ? ['idempotency-key'] : [])],
        `${where}: request headers`
      )
    }
  }
  t.same(seen.sort(), Object.keys(expected).sort())
  t.same(doc.components.securitySchemes, { bearerAuth: { type: 'http', scheme: 'bearer', bearerFormat: 'JWT' } })
})

t.test(
  'create is multipart/form-data with a binary image and the field rules; update is the JSON body schema',
  async (t) => {
    const doc = JSON.parse(await readFile(COMMITTED, 'utf8')) as Document
    const create = doc.paths['/api/portfolio/create']!.post!.requestBody!.content
    t.same(Object.keys(create), ['multipart/form-data'])
    t.same(create['multipart/form-data']!.schema, {
      $ref: '#/components/schemas/CreatePortfolioForm',
      description: 'Each field at most once; the parts are checked as they stream, before the engine is called'
    })
    const form = doc.components.schemas['CreatePortfolioForm']!
    t.match(form.properties, {
      image: { type: 'string', format: 'binary' },
      name: { type: 'string', minLength: 1, maxLength: 30 },
      type: { anyOf: [{ enum: ['PORTFOLIO'] }, { enum: ['INDEX_PORTFOLIO'] }] },
      beneficiary_wallet: { type: 'string', format: 'solana-address', minLength: 32, maxLength: 44 },
      description: { type: 'string', maxLength: 500 }
    })
    t.same(form.required, ['name', 'type'])
    // The image types the document names are the ones the check accepts, worded as the refusal is.
    t.equal(
      (form.properties as Record<string, { description?: string }>)['image']!.description,
      `${IMAGE_TYPE_NAMES}, recognised by its bytes, at most 10485760 bytes; optional`
    )
    t.equal(NOT_AN_IMAGE, 'image must be a PNG or JPEG file')
    t.equal(IMAGE_TYPE_NAMES, 'PNG or JPEG')
    t.same(doc.paths['/api/portfolio/update']!.post!.requestBody!.content['application/json']!.schema, {
      $ref: '#/components/schemas/UpdatePortfolioBody'
    })
    t.match(doc.components.schemas['UpdatePortfolioBody'], {
      required: ['portfolio_id', 'target_positions'],
      properties: { target_positions: { minItems: 1, maxItems: 100 } }
    })
    const codeOf = (name: string) =>
      (doc.components.schemas[name]!.properties!['error'] as unknown as { properties: { code: unknown } }).properties
        .code
    t.same(
      codeOf('IdempotencyKeyInUseError'),
      { const: 'IDEMPOTENCY_KEY_IN_USE', type: 'string' },
      'each status its code enum'
    )
    t.same(codeOf('NotFoundError'), { const: 'NOT_FOUND', type: 'string' })
    t.same(codeOf('ValidationError'), { const: 'VALIDATION_ERROR', type: 'string' })
    t.notMatch(JSON.stringify(doc), /def-\d/, 'named components only')
  }
)
