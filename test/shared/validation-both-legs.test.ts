/**
 * The gateway and the reference engine check the same
 * schema the same way (lengths in characters, i.e. code points) and answer the
 * same 400 in the same words, apart from `source`. Each case goes to both legs
 * over real sockets: the gateway (in front of the real engine) and the engine alone.
 */
import Fastify from 'fastify'
import t, { type Test } from 'tap'
import { request } from 'undici'
import { Type } from '@sinclair/typebox'
import { schemaProblem, SCHEMA_VALIDATION, type CompiledSchema } from '../../src/shared/schema-validation.js'
import { bearer, build, MINTS } from '../helpers/app.js'
import { startEngine, USER } from '../helpers/engine.js'
import { multipartBody, type MultipartPart } from '../helpers/multipart.js'

const EMOJI = '\u{1F680}' // one code point, two UTF-16 code units, four UTF-8 bytes
const FORM: MultipartPart[] = [
  { name: 'name', value: 'Blue chips' },
  { name: 'type', value: 'PORTFOLIO' }
]
const withField = (name: string, value: string): MultipartPart[] => [
  ...FORM.filter((p) => p.name !== name),
  { name, value }
]
const UPDATE = {
  portfolio_id: 'p-1',
  target_positions: [
    { mint: MINTS[0], allocation: 0.6 },
    { mint: MINTS[1], allocation: 0.4 }
  ]
}
const withTarget = (target: Record<string, unknown>) => ({
  ...UPDATE,
  target_positions: [{ ...UPDATE.target_positions[0], ...target }, UPDATE.target_positions[1]]
})

type Leg = 'portfolio-gateway' | 'portfolio-engine'

async function legs (t: Test) {
  const engine = await startEngine(t)
  const { url } = await build(t, { upstreamUrl: engine.origin })
  async function send (leg: Leg, path: string, contentType: string, body: string | Buffer) {
    const headers =
      leg === 'portfolio-gateway'
        ? { ...bearer(), 'content-type': contentType }
        : { 'x-user-id': USER, 'content-type': contentType }
    const res = await request(`${leg === 'portfolio-gateway' ? url : engine.origin}${path}`, {
      method: 'POST',
      headers,
      body
    })
    return { status: res.statusCode, json: await res.body.json() }
  }
  return {
    engine,
    create: async (leg: Leg, parts: MultipartPart[]) => {
      const form = multipartBody(parts)
      return await send(leg, '/api/portfolio/create', form.contentType, form.body)
    },
    update: async (leg: Leg, body: unknown) =>
      await send(leg, '/api/portfolio/update', 'application/json', JSON.stringify(body))
  }
}

const refusal = (source: Leg, fn: string, message: string) => ({
  success: false,
  error: { source, code: 'VALIDATION_ERROR', message, function: fn }
})

// One case per schema keyword, the exact message each leg must give.
const UPDATE_CASES: Array<[string, unknown, string]> = [
  ['minLength', { ...UPDATE, portfolio_id: '' }, 'portfolio_id must be at least 1 character'],
  ['maxLength', { ...UPDATE, portfolio_id: 'p'.repeat(129) }, 'portfolio_id must be at most 128 characters'],
  [
    'maxLength counts characters, not UTF-16 units',
    { ...UPDATE, portfolio_id: EMOJI.repeat(129) },
    'portfolio_id must be at most 128 characters'
  ],
  ['type (number)', withTarget({ allocation: '0.6' }), 'target_positions[0].allocation must be a number'],
  ['type (string)', { ...UPDATE, portfolio_id: 7 }, 'portfolio_id must be a string'],
  ['type (object)', [UPDATE], 'body must be an object'],
  ['type (array)', { ...UPDATE, target_positions: {} }, 'target_positions must be an array'],
  ['minimum', withTarget({ allocation: -0.1 }), 'target_positions[0].allocation must be >= 0'],
  ['maximum', withTarget({ allocation: 1.5 }), 'target_positions[0].allocation must be <= 1'],
  ['minItems', { ...UPDATE, target_positions: [] }, 'target_positions must have at least 1 item'],
  [
    'maxItems',
    { ...UPDATE, target_positions: Array.from({ length: 101 }, () => ({ mint: MINTS[0], allocation: 0.01 })) },
    'target_positions must have at most 100 items'
  ],
  ['required', { target_positions: UPDATE.target_positions }, 'portfolio_id is required'],
  ['required (nested)', withTarget({ mint: undefined }), 'target_positions[0].mint is required'],
  ['additionalProperties', { ...UPDATE, merge: true }, 'merge is not an accepted field'],
  [
    'format',
    withTarget({ mint: 'O'.repeat(32) }),
    'target_positions[0].mint must be a base58 Solana address (32 bytes)'
  ],
  [
    'pattern',
    { ...UPDATE, portfolio_id: 'a b' },
    'portfolio_id must be visible ASCII characters (no spaces or control characters)'
  ]
]

const CREATE_CASES: Array<[string, MultipartPart[], string]> = [
  ['minLength', withField('name', ''), 'name must be at least 1 character'],
  ['maxLength: 31 emoji', withField('name', EMOJI.repeat(31)), 'name must be at most 30 characters'],
  [
    'maxLength: a description of 501 emoji',
    [...FORM, { name: 'description', value: EMOJI.repeat(501) }],
    'description must be at most 500 characters'
  ],
  [
    'minLength of the wallet',
    [...FORM, { name: 'beneficiary_wallet', value: 'So111' }],
    'beneficiary_wallet must be at least 32 characters'
  ],
  ['enum (a union of literals)', withField('type', 'HEDGE_FUND'), 'type must be one of PORTFOLIO, INDEX_PORTFOLIO'],
  ['required', FORM.filter((p) => p.name !== 'type'), 'type is required'],
  ['additionalProperties', [...FORM, { name: 'owner', value: 'mallory' }], 'owner is not an accepted field'],
  [
    'format',
    [...FORM, { name: 'beneficiary_wallet', value: '0'.repeat(40) }],
    'beneficiary_wallet must be a base58 Solana address (32 bytes)'
  ]
]

t.test('update: each keyword is refused by both legs with the same message', async (t) => {
  const { update } = await legs(t)
  for (const [keyword, body, message] of UPDATE_CASES) {
    for (const leg of ['portfolio-gateway', 'portfolio-engine'] as const) {
      const res = await update(leg, body)
      t.equal(res.status, 400, `${keyword}: ${leg} status`)
      t.same(res.json, refusal(leg, 'updatePortfolio', message), `${keyword}: ${leg} body`)
    }
  }
})

t.test('create: each keyword is refused by both legs with the same message; nothing is created', async (t) => {
  const { create, engine } = await legs(t)
  for (const [keyword, parts, message] of CREATE_CASES) {
    for (const leg of ['portfolio-gateway', 'portfolio-engine'] as const) {
      const res = await create(leg, parts)
      t.equal(res.status, 400, `${keyword}: ${leg} status`)
      t.same(res.json, refusal(leg, 'createPortfolio', message), `${keyword}: ${leg} body`)
    }
  }
  t.equal(engine.engine.portfolios.size, 0)
})

t.test('a 30-emoji name and a 500-emoji description are accepted by both legs', async (t) => {
  const { create, engine } = await legs(t)
  const parts = [...withField('name', EMOJI.repeat(30)), { name: 'description', value: EMOJI.repeat(500) }]
  for (const leg of ['portfolio-gateway', 'portfolio-engine'] as const) {
    const res = await create(leg, parts)
    t.equal(res.status, 200, `${leg} accepts`)
    const id = (res.json as { portfolio_id: string }).portfolio_id
    t.match(
      engine.engine.portfolios.get(id),
      { name: EMOJI.repeat(30), description: EMOJI.repeat(500) },
      `${leg}: stored whole`
    )
  }
  t.equal(engine.engine.portfolios.size, 2)
})

t.test("the mapper words the keywords our schemas do not use yet, never in Ajv's words", async (t) => {
  // The shared compiler configuration, on a Fastify instance of its own.
  const app = Fastify({ ajv: SCHEMA_VALIDATION })
  t.teardown(() => app.close())
  const Probe = Type.Object(
    {
      kind: Type.Optional(Type.Unsafe<string>({ type: 'string', enum: ['a', 'b'] })),
      count: Type.Optional(Type.Integer({ exclusiveMinimum: 0 })),
      version: Type.Optional(Type.Literal(2)),
      tag: Type.Optional(Type.String({ pattern: '^[a-z]+$' })),
      mail: Type.Optional(Type.String({ format: 'email' })),
      note: Type.Optional(Type.Union([Type.String(), Type.Null()])),
      either: Type.Optional(Type.Union([Type.Object({ a: Type.String() }), Type.Object({ b: Type.String() })])),
      set: Type.Optional(Type.Array(Type.Number(), { uniqueItems: true })),
      flag: Type.Optional(Type.Boolean())
    },
    { additionalProperties: false }
  )
  let validate: CompiledSchema | undefined
  app.get('/', async (request) => {
    validate = request.compileValidationSchema(Probe) as CompiledSchema
    return 'ok'
  })
  await app.inject('/')
  const problem = (data: unknown) => schemaProblem(validate!, data, 'probe')
  t.equal(problem({}), undefined)
  t.equal(problem({ kind: 'c' }), 'kind must be one of a, b')
  t.equal(problem({ count: 0 }), 'count must be > 0')
  t.equal(problem({ count: 1.5 }), 'count must be an integer')
  t.equal(problem({ version: 3 }), 'version must be 2')
  t.equal(problem({ tag: 'A' }), 'tag has characters that are not allowed')
  t.equal(problem({ mail: 'nobody' }), 'mail must be a valid email')
  t.equal(problem({ note: 1 }), 'note must be a string or null')
  t.equal(problem({ either: {} }), 'either has a value that is not allowed')
  t.equal(problem({ set: [1, 1] }), 'set is invalid')
  t.equal(problem({ flag: 'yes' }), 'flag must be a boolean')
  t.equal(problem(null), 'probe must be an object')
})
