/**
 * The typed client (client/) against the real gateway on a real port, with
 * the reference engine behind it: every result is the typed value or the
 * typed error the contract names.
 */
import { readFile } from 'node:fs/promises'
import t, { type Test } from 'tap'
import { PNG_IMAGE } from '../../fixtures/images.js'
import { createGatewayClient, errorMessage, isStructuredError, type SimpleError } from '../../client/index.js'
import { contractHandler, startStubUpstream } from '../../fixtures/stub-upstream.js'
import { build, hs256, MINTS } from '../helpers/app.js'
import { startEngine } from '../helpers/engine.js'

async function setUp (t: Test, token = hs256({ sub: 'alice' })) {
  const engine = await startEngine(t)
  const { url } = await build(t, { upstreamUrl: engine.origin })
  return { engine, url, gateway: createGatewayClient({ baseUrl: url, token }) }
}

t.test('ping, create with an image, update: typed values', async (t) => {
  const { engine, gateway } = await setUp(t)
  const png = await readFile(PNG_IMAGE)

  const pong = await gateway.pingEngine({ requestId: 'client-ping' })
  t.same(pong, { ok: true, status: 200, data: 'pong', requestId: 'client-ping', replayed: false })

  const created = await gateway.createPortfolio({
    name: 'Blue chips',
    type: 'PORTFOLIO',
    description: 'from the client',
    image: png,
    filename: 'logo.png'
  })
  if (!created.ok) throw new Error(`create failed: ${errorMessage(created.error)}`)
  t.equal(created.status, 200)
  const id: string = created.data.portfolio_id
  t.match(engine.engine.portfolios.get(id), {
    owner: 'alice',
    name: 'Blue chips',
    description: 'from the client',
    image: { mime: 'image/png', bytes: png.length }
  })

  const fromBlob = await gateway.createPortfolio({
    name: 'From a Blob',
    type: 'INDEX_PORTFOLIO',
    image: new Blob([png], { type: 'image/png' })
  })
  t.equal(fromBlob.ok, true, 'a Blob works as well as a Buffer')

  const updated = await gateway.updatePortfolio({
    portfolio_id: id,
    target_positions: [
      { mint: MINTS[0], allocation: 0.25 },
      { mint: MINTS[1], allocation: 0.75 }
    ]
  })
  t.same(updated.ok && updated.data, { success: true, message: 'Target positions updated' })
  t.same(engine.engine.portfolios.get(id)?.target_positions, [
    { mint: MINTS[0], allocation: 0.25 },
    { mint: MINTS[1], allocation: 0.75 }
  ])

  const health = await gateway.getEngineHealth()
  t.match(health, {
    ok: true,
    status: 200,
    data: { status: 'ok', services: { database: 'connected', cache: 'connected' } }
  })
})

t.test('a 400: the typed structured error', async (t) => {
  const { gateway } = await setUp(t)
  const bad = await gateway.updatePortfolio({
    portfolio_id: 'p-1',
    target_positions: [{ mint: MINTS[0], allocation: 0.5 }]
  })
  t.equal(bad.ok, false)
  if (bad.ok) return
  t.equal(bad.status, 400)
  t.ok(isStructuredError(bad.error))
  t.same(bad.error, {
    success: false,
    error: {
      source: 'portfolio-gateway',
      code: 'VALIDATION_ERROR',
      message: 'target_positions allocations must sum to 1 (they sum to 0.5)',
      function: 'updatePortfolio'
    }
  })
  t.match(bad.requestId, /^[0-9a-f-]{36}$/, 'the gateway-made request id')

  const noName = await gateway.createPortfolio({ name: '', type: 'PORTFOLIO' })
  t.match(noName, {
    ok: false,
    status: 400,
    error: { success: false, error: { code: 'VALIDATION_ERROR', function: 'createPortfolio' } }
  })

  const unknown = await gateway.updatePortfolio({
    portfolio_id: 'no-such-portfolio',
    target_positions: [{ mint: MINTS[0], allocation: 1 }]
  })
  t.match(unknown, { ok: false, status: 404, error: { success: false, error: { code: 'NOT_FOUND' } } })
})

t.test('a 401: the typed simple error, on every call', async (t) => {
  const { gateway } = await setUp(t, hs256({ sub: 'alice', exp: 1 }))
  const results = [
    ['ping', await gateway.pingEngine()],
    [
      'update',
      await gateway.updatePortfolio({ portfolio_id: 'p-1', target_positions: [{ mint: MINTS[0], allocation: 1 }] })
    ],
    ['create', await gateway.createPortfolio({ name: 'x', type: 'PORTFOLIO' })]
  ] as const
  for (const [name, res] of results) {
    t.equal(res.ok, false, name)
    if (res.status !== 401) continue
    // Narrowed by the status alone: a 401 is the simple shape on every operation.
    const body: SimpleError = res.error
    t.same(body, { error: 'token expired' }, `${name}: simple shape`)
    t.equal(isStructuredError(body), false)
    t.equal(errorMessage(body), 'token expired')
  }
})

t.test('a 409 narrows to its code and says how long to wait', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const gateway = createGatewayClient({ baseUrl: url, token: hs256({ sub: 'alice' }) })
  // The engine holds the first update until the second has been answered.
  let arrived!: () => void
  const atEngine = new Promise<void>((resolve) => {
    arrived = resolve
  })
  let release!: () => void
  const held = new Promise<void>((resolve) => {
    release = resolve
  })
  stub.handle((req, res, body) => {
    arrived()
    void held.then(() => contractHandler(req, res, body))
  })
  const update = { portfolio_id: 'p-1', target_positions: [{ mint: MINTS[0], allocation: 1 }] }
  const first = gateway.updatePortfolio(update, { idempotencyKey: 'k-409' })
  await atEngine
  const second = await gateway.updatePortfolio(update, { idempotencyKey: 'k-409' })
  release()
  t.match(await first, { ok: true, status: 200 })
  t.equal(second.status, 409)
  if (second.ok || second.status !== 409) return
  const code: 'IDEMPOTENCY_KEY_IN_USE' = second.error.error.code
  t.equal(code, 'IDEMPOTENCY_KEY_IN_USE')
  t.equal(second.retryAfter, 1, "an update may run for the engine's deadline (1 s here)")
})

t.test('a token function is asked for each call; the traceparent reaches the engine', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  let asked = 0
  const gateway = createGatewayClient({
    baseUrl: `${url}/`,
    token: async () => {
      asked++
      return hs256({ sub: 'bob' })
    }
  })
  const traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'
  t.match(await gateway.pingEngine({ traceparent }), { ok: true, data: 'pong' })
  t.match(await gateway.pingEngine(), { ok: true })
  t.equal(asked, 2)
  // The trace continues; its sampled flag is the client's only from TRUST_PROXY, which this gateway does not set.
  t.match(String(stub.requests[0]?.headers.traceparent), /^00-4bf92f3577b34da6a3ce929d0e0e4736-[0-9a-f]{16}-00$/)
  t.equal(stub.requests[1]?.headers['x-user-id'], 'bob')
})
