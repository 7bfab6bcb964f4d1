/** Forwarding over real sockets: what the engine receives, and what the client gets back. */
import t from 'tap'
import { request } from 'undici'
import { json, startStubUpstream } from '../../fixtures/stub-upstream.js'
import { bearer, build, hs256, validUpdate } from '../helpers/app.js'

t.test('ping: text/plain pong, with x-user-id and x-request-id sent to the engine', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const res = await request(`${url}/api/portfolio/ping`, {
    headers: {
      ...bearer(hs256({ sub: 'carol' })),
      'x-request-id': 'req-abc-123',
      'x-user-id': 'mallory',
      'x-forwarded-user': 'mallory',
      cookie: 'session=1'
    }
  })
  t.equal(res.statusCode, 200)
  t.equal(res.headers['content-type'], 'text/plain; charset=utf-8')
  t.equal(res.headers['x-request-id'], 'req-abc-123')
  t.equal(await res.body.text(), 'pong')
  const sent = stub.requests[0]!
  t.equal(sent.method, 'GET')
  t.equal(sent.url, '/api/portfolio/ping')
  t.equal(sent.headers['x-user-id'], 'carol')
  t.equal(sent.headers['x-request-id'], 'req-abc-123')
  t.equal(sent.headers.authorization, undefined, 'the client token stays at the edge')
  t.equal(sent.headers.cookie, undefined, 'client identity headers are not forwarded')
  t.equal(sent.headers['x-forwarded-user'], undefined)
})

t.test('update: the validated body reaches the engine and its answer comes back', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const res = await request(`${url}/api/portfolio/update`, {
    method: 'POST',
    headers: { ...bearer(), 'content-type': 'application/json' },
    body: JSON.stringify(validUpdate())
  })
  t.equal(res.statusCode, 200)
  t.same(await res.body.json(), { success: true, message: 'Target positions updated' })
  const sent = stub.requests[0]!
  t.equal(sent.headers['content-type'], 'application/json')
  t.same(JSON.parse(sent.body.toString()), validUpdate())
  t.equal(sent.headers['x-user-id'], 'alice')
})

t.test(
  "update: the engine gets the validated body in the schema's key order, whatever order and spacing the client used",
  async (t) => {
    const stub = await startStubUpstream()
    t.teardown(stub.close)
    const { url } = await build(t, { upstreamUrl: stub.url })
    const u = validUpdate()
    const reordered = `{ "target_positions": [${u.target_positions.map((p) => `{"allocation": ${p.allocation}, "mint": "${p.mint}"}`).join(', ')}], "portfolio_id": "${u.portfolio_id}" }`
    const res = await request(`${url}/api/portfolio/update`, {
      method: 'POST',
      headers: { ...bearer(), 'content-type': 'application/json' },
      body: reordered
    })
    t.equal(res.statusCode, 200)
    await res.body.dump()
    t.equal(
      stub.requests[0]!.body.toString(),
      JSON.stringify({
        portfolio_id: u.portfolio_id,
        target_positions: u.target_positions.map((p) => ({ mint: p.mint, allocation: p.allocation }))
      })
    )
  }
)

t.test('a generated request id when the client sends none or an insane one', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  for (const given of [undefined, 'x'.repeat(200), 'two words']) {
    const res = await request(`${url}/api/portfolio/ping`, {
      headers: { ...bearer(), ...(given === undefined ? {} : { 'x-request-id': given }) }
    })
    await res.body.text()
    const id = res.headers['x-request-id'] as string
    t.match(id, /^[0-9a-f-]{36}$/, `generated for ${String(given).slice(0, 12)}`)
    t.equal(stub.requests.at(-1)!.headers['x-request-id'], id, 'the engine sees the same id')
  }
  const badUrl = await request(`${url}/api/portfolio/%c0${'A'.repeat(5000)}`, { headers: { 'x-request-id': 'r-400' } })
  t.equal(badUrl.statusCode, 400)
  t.equal(badUrl.headers['x-request-id'], 'r-400', 'a URL the router cannot read still gets its id')
  t.same(await badUrl.body.json(), { error: 'malformed URL' }, 'simple shape, the URL not echoed')
  const notFound = await request(`${url}/nope`, { headers: { 'x-request-id': 'r-404' } })
  t.equal(notFound.statusCode, 404)
  t.equal(notFound.headers['x-request-id'], 'r-404', 'errors carry the id too')
  t.same(await notFound.body.json(), { error: 'no route GET /nope' })
})

t.test("the engine's structured errors pass through unchanged", async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const notFound = {
    success: false,
    error: {
      source: 'portfolio-engine',
      code: 'NOT_FOUND',
      message: 'portfolio not found',
      function: 'updatePortfolio'
    }
  }
  stub.handle((_req, res) => json(res, 404, notFound))
  const res = await request(`${url}/api/portfolio/update`, {
    method: 'POST',
    headers: { ...bearer(), 'content-type': 'application/json' },
    body: JSON.stringify(validUpdate())
  })
  t.equal(res.statusCode, 404)
  t.same(await res.body.json(), notFound)

  const leaky = {
    success: false,
    error: {
      source: 'portfolio-engine',
      code: 'INTERNAL_ERROR',
      message: 'db down',
      function: 'updatePortfolio',
      stack: 'Error: at /srv/engine/db.js:12'
    },
    debug: { dbHost: '10.0.0.5' }
  }
  stub.handle((_req, res) => json(res, 500, leaky))
  const leak = await request(`${url}/api/portfolio/update`, {
    method: 'POST',
    headers: { ...bearer(), 'content-type': 'application/json' },
    body: JSON.stringify(validUpdate())
  })
  t.equal(leak.statusCode, 502, 'an engine error with more than the structured shape is not passed on')
  t.same(await leak.body.json(), { error: 'portfolio engine sent an invalid response' })

  const internal = {
    success: false,
    error: {
      source: 'portfolio-engine',
      code: 'INTERNAL_ERROR',
      message: 'store unavailable',
      function: 'pingPortfolio'
    }
  }
  stub.handle((_req, res) => json(res, 500, internal))
  const ping = await request(`${url}/api/portfolio/ping`, { headers: bearer() })
  t.equal(ping.statusCode, 500)
  t.same(await ping.body.json(), internal)
})
