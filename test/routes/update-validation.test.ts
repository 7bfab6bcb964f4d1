/**
 * POST /api/portfolio/update: every rule broken on its own is a 400
 * VALIDATION_ERROR naming the field, answered before any engine call.
 */
import t from 'tap'
import { startStubUpstream } from '../../fixtures/stub-upstream.js'
import { bearer, build, MINTS, validUpdate } from '../helpers/app.js'

const err = (message: string): unknown => ({
  success: false,
  error: { source: 'portfolio-gateway', code: 'VALIDATION_ERROR', message, function: 'updatePortfolio' }
})

const body = (patch: (b: ReturnType<typeof validUpdate>) => unknown): unknown => {
  const b = validUpdate()
  return patch(b) ?? b
}

const CASES: Array<[string, unknown, string]> = [
  ['portfolio_id missing', body((b) => ({ target_positions: b.target_positions })), 'portfolio_id is required'],
  ['portfolio_id empty', body((b) => ({ ...b, portfolio_id: '' })), 'portfolio_id must be at least 1 character'],
  ['portfolio_id with control characters', body((b) => ({ ...b, portfolio_id: '\u0000\r\n../x' })), 'portfolio_id must be visible ASCII characters (no spaces or control characters)'],
  ['portfolio_id of spaces', body((b) => ({ ...b, portfolio_id: '   ' })), 'portfolio_id must be visible ASCII characters (no spaces or control characters)'],
  ['portfolio_id not a string', body((b) => ({ ...b, portfolio_id: 7 })), 'portfolio_id must be a string'],
  ['target_positions missing', { portfolio_id: 'p-1' }, 'target_positions is required'],
  ['target_positions empty', body((b) => ({ ...b, target_positions: [] })), 'target_positions must have at least 1 item'],
  ['101 target positions', body((b) => ({ ...b, target_positions: Array.from({ length: 101 }, () => ({ mint: MINTS[0], allocation: 0.01 })) })), 'target_positions must have at most 100 items'],
  ['allocation above 1', body((b) => { b.target_positions[1]!.allocation = 1.5 }), 'target_positions[1].allocation must be <= 1'],
  ['allocation below 0', body((b) => { b.target_positions[0]!.allocation = -0.1 }), 'target_positions[0].allocation must be >= 0'],
  ['allocation as a string is not coerced', body((b) => ({ ...b, target_positions: [{ mint: MINTS[0], allocation: '0.6' }, b.target_positions[1]] })), 'target_positions[0].allocation must be a number'],
  ['allocation missing', body((b) => ({ ...b, target_positions: [{ mint: MINTS[0] }, b.target_positions[1]] })), 'target_positions[0].allocation is required'],
  ['mint missing', body((b) => ({ ...b, target_positions: [b.target_positions[0], { allocation: 0.4 }] })), 'target_positions[1].mint is required'],
  ['mint not base58', body((b) => { b.target_positions[0]!.mint = '0OIl0OIl0OIl0OIl0OIl0OIl0OIl0OIl0OIl' }), 'target_positions[0].mint must be a base58 Solana address (32 bytes)'],
  ['mint too short', body((b) => { b.target_positions[0]!.mint = 'So1111111' }), 'target_positions[0].mint must be at least 32 characters'],
  ['mint base58 but not 32 bytes', body((b) => { b.target_positions[0]!.mint = 'zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz' }), 'target_positions[0].mint must be a base58 Solana address (32 bytes)'],
  ['unknown field', body((b) => ({ ...b, owner: 'mallory' })), 'owner is not an accepted field'],
  ['unknown field in a position', body((b) => ({ ...b, target_positions: [{ ...b.target_positions[0], weight: 1 }, b.target_positions[1]] })), 'target_positions[0].weight is not an accepted field'],
  ['sum below 1', body((b) => { b.target_positions[1]!.allocation = 0.3 }), 'target_positions allocations must sum to 1 (they sum to 0.9)'],
  ['sum above 1', body((b) => { b.target_positions[1]!.allocation = 0.5 }), 'target_positions allocations must sum to 1 (they sum to 1.1)'],
  ['duplicate mint', body((b) => { b.target_positions[1]!.mint = MINTS[0] }), 'target_positions[1].mint repeats target_positions[0].mint'],
  ['body is an array', [validUpdate()], 'body must be an object'],
  ['body is null', null, 'body must be an object']
]

t.test('each broken rule is a 400 naming the field, and the engine is never called', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { app } = await build(t, { upstreamUrl: stub.url })
  for (const [name, payload, message] of CASES) {
    const res = await app.inject({ method: 'POST', url: '/api/portfolio/update', headers: { ...bearer(), 'content-type': 'application/json' }, payload: JSON.stringify(payload) })
    t.equal(res.statusCode, 400, name)
    t.same(res.json(), err(message), `${name}: body`)
  }
  t.equal(stub.requests.length, 0)
})

t.test('floating-point sums within tolerance are accepted', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { app } = await build(t, { upstreamUrl: stub.url })
  const thirds = { portfolio_id: 'p-1', target_positions: [0, 1, 2].map((i) => ({ mint: MINTS[i]!, allocation: 0.1 + 0.2 })).concat([{ mint: MINTS[3], allocation: 0.1 }]) }
  const res = await app.inject({ method: 'POST', url: '/api/portfolio/update', headers: bearer(), payload: thirds })
  t.equal(res.statusCode, 200, '0.30000000000000004 x3 + 0.1 sums to 1 within tolerance')
})

t.test('body-level faults', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { app } = await build(t, { upstreamUrl: stub.url })
  const send = (payload: string, headers: Record<string, string> = { 'content-type': 'application/json' }) =>
    app.inject({ method: 'POST', url: '/api/portfolio/update', headers: { ...bearer(), ...headers }, payload })

  const malformed = await send('{"portfolio_id": "p-1", ')
  t.equal(malformed.statusCode, 400)
  t.same(malformed.json(), err('body is not valid JSON'))

  const empty = await send('')
  t.equal(empty.statusCode, 400)
  t.same(empty.json(), err('body must not be empty'))

  const huge = await send(JSON.stringify({ portfolio_id: 'x'.repeat(70 * 1024), target_positions: [] }))
  t.equal(huge.statusCode, 400)
  t.same(huge.json(), err('body must be at most 65536 bytes'))

  const form = await send('portfolio_id=p-1', { 'content-type': 'application/x-www-form-urlencoded' })
  t.equal(form.statusCode, 400)
  t.same(form.json(), err('content-type is not accepted by this endpoint'))

  const proto = await send('{"portfolio_id":"p-1","target_positions":[],"__proto__":{"x":1}}')
  t.equal(proto.statusCode, 400)
  t.same(proto.json(), err('body is not valid JSON'), 'prototype poisoning is refused by secure-json-parse')
  t.equal(stub.requests.length, 0)
})
