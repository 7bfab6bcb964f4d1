/**
 * Gateway and reference engine together over real sockets (DECISIONS 1-2):
 * update replaces, and an unknown or foreign id is the same 404.
 */
import t from 'tap'
import { request } from 'undici'
import { bearer, build, hs256, MINTS } from '../helpers/app.js'
import { startEngine } from '../helpers/engine.js'
import { multipartBody } from '../helpers/multipart.js'
import { newImageDir, startEngineProcess } from '../helpers/engine-process.js'
import { ensureBuilt } from '../helpers/processes.js'
import { requireRedis, startRedis } from '../helpers/redis.js'

t.test('create as alice, update as alice, then bob and a made-up id get the same 404', async (t) => {
  const engine = await startEngine(t)
  const { url } = await build(t, { upstreamUrl: engine.origin })
  const alice = hs256({ sub: 'alice' })
  const form = multipartBody([
    { name: 'name', value: 'Mine' },
    { name: 'type', value: 'PORTFOLIO' }
  ])
  const created = await request(`${url}/api/portfolio/create`, {
    method: 'POST',
    headers: { ...bearer(alice), 'content-type': form.contentType },
    body: form.body
  })
  t.equal(created.statusCode, 200)
  const { portfolio_id: id } = (await created.body.json()) as { portfolio_id: string }
  t.match(engine.engine.portfolios.get(id), { owner: 'alice', status: 'DRAFT', positions: [] })

  const update = (token: string, portfolioId: string, targets: Array<{ mint: string; allocation: number }>) =>
    request(`${url}/api/portfolio/update`, {
      method: 'POST',
      headers: { ...bearer(token), 'content-type': 'application/json' },
      body: JSON.stringify({ portfolio_id: portfolioId, target_positions: targets })
    })

  const first = await update(alice, id, [
    { mint: MINTS[0], allocation: 0.5 },
    { mint: MINTS[1], allocation: 0.5 }
  ])
  t.equal(first.statusCode, 200)
  t.same(await first.body.json(), { success: true, message: 'Target positions updated' })
  const second = await update(alice, id, [{ mint: MINTS[2], allocation: 1 }])
  t.equal(second.statusCode, 200)
  await second.body.dump()
  t.same(
    engine.engine.portfolios.get(id)?.target_positions,
    [{ mint: MINTS[2], allocation: 1 }],
    'the second update replaced the first'
  )

  const foreign = await update(hs256({ sub: 'bob' }), id, [{ mint: MINTS[0], allocation: 1 }])
  const unknown = await update(alice, 'no-such-portfolio', [{ mint: MINTS[0], allocation: 1 }])
  t.equal(foreign.statusCode, 404)
  t.equal(unknown.statusCode, 404)
  const foreignBody = await foreign.body.text()
  t.equal(foreignBody, await unknown.body.text(), "byte-identical: nobody can probe for other users' ids")
  t.match(JSON.parse(foreignBody), {
    success: false,
    error: { code: 'NOT_FOUND', source: 'portfolio-engine', function: 'updatePortfolio' }
  })
  t.same(engine.engine.portfolios.get(id)?.target_positions, [{ mint: MINTS[2], allocation: 1 }], 'bob changed nothing')
})

t.test('a create with a 30-emoji name succeeds end to end: both legs count characters', async (t) => {
  const engine = await startEngine(t)
  const { url } = await build(t, { upstreamUrl: engine.origin })
  const name = '\u{1F4C8}'.repeat(30) // 30 code points, 60 UTF-16 code units
  const form = multipartBody([
    { name: 'name', value: name },
    { name: 'type', value: 'PORTFOLIO' }
  ])
  const created = await request(`${url}/api/portfolio/create`, {
    method: 'POST',
    headers: { ...bearer(), 'content-type': form.contentType },
    body: form.body
  })
  t.equal(created.statusCode, 200)
  const { portfolio_id: id } = (await created.body.json()) as { portfolio_id: string }
  t.equal(engine.engine.portfolios.get(id)?.name, name)
})

t.test(
  'two gateways, each in front of its own engine, the engines on one Redis: create through one, update through the other',
  async (t) => {
    if (!requireRedis(t)) return
    ensureBuilt()
    const redis = await startRedis(t)
    const imageDir = newImageDir(t)
    const env = { ENGINE_REDIS_URL: redis.url, ENGINE_IMAGE_DIR: imageDir }
    const [engineA, engineB] = await Promise.all([startEngineProcess(t, env), startEngineProcess(t, env)])
    await Promise.all([engineA.waitFor(/portfolio store connected/), engineB.waitFor(/portfolio store connected/)])
    const [gatewayA, gatewayB] = await Promise.all([
      build(t, { upstreamUrl: engineA.url }),
      build(t, { upstreamUrl: engineB.url })
    ])
    const alice = hs256({ sub: 'alice' })

    const health = await request(`${gatewayB.url}/api/health`, { headers: bearer(alice) })
    t.equal(health.statusCode, 200)
    t.match(
      await health.body.json(),
      { status: 'ok', services: { database: 'connected', cache: 'connected' } },
      "/api/health reports the engine's Redis"
    )

    const form = multipartBody([
      { name: 'name', value: 'Shared' },
      { name: 'type', value: 'PORTFOLIO' }
    ])
    const created = await request(`${gatewayA.url}/api/portfolio/create`, {
      method: 'POST',
      headers: { ...bearer(alice), 'content-type': form.contentType },
      body: form.body
    })
    t.equal(created.statusCode, 200)
    const { portfolio_id: id } = (await created.body.json()) as { portfolio_id: string }
    const update = (url: string, token: string) =>
      request(`${url}/api/portfolio/update`, {
        method: 'POST',
        headers: { ...bearer(token), 'content-type': 'application/json' },
        body: JSON.stringify({ portfolio_id: id, target_positions: [{ mint: MINTS[1], allocation: 1 }] })
      })
    const updated = await update(gatewayB.url, alice)
    t.equal(updated.statusCode, 200)
    t.same(await updated.body.json(), { success: true, message: 'Target positions updated' })
    const foreign = await update(gatewayB.url, hs256({ sub: 'bob' }))
    t.equal(foreign.statusCode, 404)
    t.match(await foreign.body.json(), { success: false, error: { code: 'NOT_FOUND', source: 'portfolio-engine' } })
  }
)
