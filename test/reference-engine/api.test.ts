import { Writable } from 'node:stream'
import t from 'tap'
import { MINTS, OTHER_USER, USER, startEngine } from '../helpers/engine.js'
import { multipartBody } from '../helpers/multipart.js'

const SOURCE = 'portfolio-engine'
const structured = (code: string, message: string, fn: string) => ({
  success: false,
  error: { source: SOURCE, code, message, function: fn }
})

async function createPortfolio (call: Awaited<ReturnType<typeof startEngine>>['call'], user = USER): Promise<string> {
  const { body, contentType } = multipartBody([
    { name: 'name', value: 'Blue chips' },
    { name: 'type', value: 'PORTFOLIO' }
  ])
  const res = await call('/api/portfolio/create', {
    method: 'POST',
    headers: { 'content-type': contentType, 'x-user-id': user },
    body
  })
  return (res.json as { portfolio_id: string }).portfolio_id
}

t.test('GET /health reports the store and cache without x-user-id', async (t) => {
  const { call } = await startEngine(t)
  const res = await call('/health')
  t.equal(res.status, 200)
  t.same(res.json, { status: 'ok', services: { database: 'connected', cache: 'connected' } })
})

t.test('GET /api/portfolio/ping answers text pong', async (t) => {
  const { call } = await startEngine(t)
  const res = await call('/api/portfolio/ping', { headers: { 'x-user-id': USER } })
  t.equal(res.status, 200)
  t.equal(res.type, 'text/plain; charset=utf-8')
  t.equal(res.text, 'pong')
})

t.test('every portfolio route needs x-user-id', async (t) => {
  const { call, engine } = await startEngine(t)
  const missing = (fn: string) => structured('UNAUTHORIZED', 'x-user-id header is required', fn)
  const ping = await call('/api/portfolio/ping')
  t.equal(ping.status, 401)
  t.same(ping.json, missing('pingPortfolio'))
  const blank = await call('/api/portfolio/ping', { headers: { 'x-user-id': '  ' } })
  t.equal(blank.status, 401)
  t.same(blank.json, missing('pingPortfolio'))
  const { body, contentType } = multipartBody([
    { name: 'name', value: 'A' },
    { name: 'type', value: 'PORTFOLIO' }
  ])
  const create = await call('/api/portfolio/create', { method: 'POST', headers: { 'content-type': contentType }, body })
  t.equal(create.status, 401)
  t.same(create.json, missing('createPortfolio'))
  const update = await call('/api/portfolio/update', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: '{}'
  })
  t.equal(update.status, 401)
  t.same(update.json, missing('updatePortfolio'))
  t.equal(engine.portfolios.size, 0)
})

t.test('unknown routes are a structured 404', async (t) => {
  const { call } = await startEngine(t, { serviceName: 'engine-under-test' })
  const res = await call('/api/portfolio/delete?x=1', { headers: { 'x-user-id': USER } })
  t.equal(res.status, 404)
  t.same(res.json, {
    success: false,
    error: {
      source: 'engine-under-test',
      code: 'NOT_FOUND',
      message: 'route GET /api/portfolio/delete not found',
      function: 'notFound'
    }
  })
})

t.test('update replaces the target positions', async (t) => {
  const { call, update, engine } = await startEngine(t)
  const id = await createPortfolio(call)
  const first = await update({
    portfolio_id: id,
    target_positions: [
      { mint: MINTS[0], allocation: 0.5 },
      { mint: MINTS[1], allocation: 0.5 }
    ]
  })
  t.equal(first.status, 200)
  t.same(first.json, { success: true, message: 'Target positions updated' })
  t.same(engine.portfolios.get(id)?.target_positions, [
    { mint: MINTS[0], allocation: 0.5 },
    { mint: MINTS[1], allocation: 0.5 }
  ])

  // 0.1 + 0.2 + 0.7 is 0.9999999999999999 in floating point: within tolerance.
  const second = await update({
    portfolio_id: id,
    target_positions: [
      { mint: MINTS[2], allocation: 0.1 },
      { mint: MINTS[1], allocation: 0.2 },
      { mint: MINTS[0], allocation: 0.7 }
    ]
  })
  t.equal(second.status, 200)
  const stored = engine.portfolios.get(id)
  t.same(
    stored?.target_positions,
    [
      { mint: MINTS[2], allocation: 0.1 },
      { mint: MINTS[1], allocation: 0.2 },
      { mint: MINTS[0], allocation: 0.7 }
    ],
    'replaced, not merged'
  )
  t.equal(stored?.status, 'DRAFT')
  t.same(stored?.positions, [])
})

t.test('unknown and foreign portfolio ids get the same 404', async (t) => {
  const { call, update, engine } = await startEngine(t)
  const id = await createPortfolio(call, OTHER_USER)
  const positions = [{ mint: MINTS[0], allocation: 1 }]
  const expected = structured('NOT_FOUND', 'portfolio_id does not name a portfolio of this user', 'updatePortfolio')
  const unknown = await update({ portfolio_id: 'no-such-portfolio', target_positions: positions })
  const foreign = await update({ portfolio_id: id, target_positions: positions })
  t.equal(unknown.status, 404)
  t.equal(foreign.status, 404)
  t.same(unknown.json, expected)
  t.equal(foreign.text, unknown.text, 'byte-identical bodies')
  t.same(engine.portfolios.get(id)?.target_positions, [], 'the foreign portfolio is untouched')
  t.equal(
    (await update({ portfolio_id: id, target_positions: positions }, OTHER_USER)).status,
    200,
    'its owner can update it'
  )
})

t.test('update refuses invalid bodies with a 400 naming the field', async (t) => {
  const { call, update } = await startEngine(t)
  const id = await createPortfolio(call)
  const cases: Array<[string, unknown, string]> = [
    ['missing id', { target_positions: [{ mint: MINTS[0], allocation: 1 }] }, 'portfolio_id is required'],
    [
      'empty id',
      { portfolio_id: '', target_positions: [{ mint: MINTS[0], allocation: 1 }] },
      'portfolio_id must be at least 1 character'
    ],
    [
      'numeric id',
      { portfolio_id: 7, target_positions: [{ mint: MINTS[0], allocation: 1 }] },
      'portfolio_id must be a string'
    ],
    ['no positions', { portfolio_id: id, target_positions: [] }, 'target_positions must have at least 1 item'],
    ['positions not an array', { portfolio_id: id, target_positions: {} }, 'target_positions must be an array'],
    [
      'allocation over 1',
      {
        portfolio_id: id,
        target_positions: [
          { mint: MINTS[0], allocation: 0.5 },
          { mint: MINTS[1], allocation: 0.5 },
          { mint: MINTS[2], allocation: 1.5 }
        ]
      },
      'target_positions[2].allocation must be <= 1'
    ],
    [
      'negative allocation',
      { portfolio_id: id, target_positions: [{ mint: MINTS[0], allocation: -0.1 }] },
      'target_positions[0].allocation must be >= 0'
    ],
    [
      'string allocation (no coercion)',
      { portfolio_id: id, target_positions: [{ mint: MINTS[0], allocation: '1' }] },
      'target_positions[0].allocation must be a number'
    ],
    [
      'bad mint',
      { portfolio_id: id, target_positions: [{ mint: 'O'.repeat(32), allocation: 1 }] },
      'target_positions[0].mint must be a base58 Solana address (32 bytes)'
    ],
    [
      'short mint',
      { portfolio_id: id, target_positions: [{ mint: 'abc', allocation: 1 }] },
      'target_positions[0].mint must be at least 32 characters'
    ],
    [
      'extra field',
      { portfolio_id: id, target_positions: [{ mint: MINTS[0], allocation: 1 }], merge: true },
      'merge is not an accepted field'
    ],
    [
      'sum below 1',
      {
        portfolio_id: id,
        target_positions: [
          { mint: MINTS[0], allocation: 0.5 },
          { mint: MINTS[1], allocation: 0.4 }
        ]
      },
      'target_positions allocations must sum to 1 (they sum to 0.9)'
    ],
    [
      'repeated mint',
      {
        portfolio_id: id,
        target_positions: [
          { mint: MINTS[0], allocation: 0.5 },
          { mint: MINTS[0], allocation: 0.5 }
        ]
      },
      'target_positions[1].mint repeats target_positions[0].mint'
    ],
    ['not an object', [1, 2], 'body must be an object'],
    [
      'too many positions',
      { portfolio_id: id, target_positions: Array.from({ length: 101 }, () => ({ mint: MINTS[0], allocation: 0 })) },
      'target_positions must have at most 100 items'
    ]
  ]
  for (const [name, body, message] of cases) {
    const res = await update(body)
    t.equal(res.status, 400, name)
    t.same(res.json, structured('VALIDATION_ERROR', message, 'updatePortfolio'), name)
  }
})

t.test('update refuses bodies Fastify cannot parse as 400 VALIDATION_ERROR', async (t) => {
  const { call } = await startEngine(t)
  const post = async (headers: Record<string, string>, body: string) =>
    await call('/api/portfolio/update', { method: 'POST', headers: { 'x-user-id': USER, ...headers }, body })
  const broken = await post({ 'content-type': 'application/json' }, '{"portfolio_id":')
  t.equal(broken.status, 400)
  t.match(broken.json, {
    success: false,
    error: { source: SOURCE, code: 'VALIDATION_ERROR', message: String, function: 'updatePortfolio' }
  })
  const huge = await post(
    { 'content-type': 'application/json' },
    JSON.stringify({ portfolio_id: 'x'.repeat(70 * 1024) })
  )
  t.equal(huge.status, 400)
  t.same(huge.json, structured('VALIDATION_ERROR', 'body must be at most 65536 bytes', 'updatePortfolio'))
  const text = await post({ 'content-type': 'text/plain' }, 'hello')
  t.equal(text.status, 400)
  t.same(text.json, structured('VALIDATION_ERROR', 'body must be an object', 'updatePortfolio'))
  const xml = await post({ 'content-type': 'application/xml' }, '<a/>')
  t.equal(xml.status, 400)
  t.same(xml.json, structured('VALIDATION_ERROR', 'content-type is not accepted by this endpoint', 'updatePortfolio'))
})

t.test('unexpected failures are a 500 that hides the cause', async (t) => {
  const { call, engine } = await startEngine(t)
  engine.portfolios.replaceTargets = () => {
    throw new Error('disk on fire at /var/secret')
  }
  const id = await createPortfolio(call)
  const res = await call('/api/portfolio/update', {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-user-id': USER },
    body: JSON.stringify({ portfolio_id: id, target_positions: [{ mint: MINTS[0], allocation: 1 }] })
  })
  t.equal(res.status, 500)
  t.same(res.json, structured('INTERNAL_ERROR', 'Internal error', 'updatePortfolio'))
})

t.test('logs carry the x-request-id the gateway sent', async (t) => {
  const lines: string[] = []
  const stream = new Writable({
    write (chunk: Buffer, _encoding, done) {
      lines.push(chunk.toString())
      done()
    }
  })
  const { call } = await startEngine(t, { logger: { level: 'info', stream } })
  await call('/api/portfolio/ping', { headers: { 'x-user-id': USER, 'x-request-id': 'req-from-gateway-42' } })
  const records = lines.map((l) => JSON.parse(l) as { reqId?: string; msg?: string })
  t.ok(records.some((r) => r.reqId === 'req-from-gateway-42' && r.msg === 'incoming request'))
  t.ok(records.some((r) => r.reqId === 'req-from-gateway-42' && r.msg === 'request completed'))
})
