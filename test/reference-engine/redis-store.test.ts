/**
 * Engines that agree: with ENGINE_REDIS_URL, portfolios,
 * owners, target positions and the create deduplication live in Redis, and
 * images in the directory the engines share. Real redis-server, real engine
 * processes from dist/; waits are on log lines, never sleeps.
 */
import { readdirSync, readFileSync } from 'node:fs'
import { Readable } from 'node:stream'
import { Redis } from 'ioredis'
import pino from 'pino'
import t, { type Test } from 'tap'
import { Agent, request } from 'undici'
import { PNG_IMAGE } from '../../fixtures/images.js'
import { attemptUntil, MINTS, OTHER_USER, USER } from '../helpers/engine.js'
import { newImageDir, startEngineProcess, type EngineProcess } from '../helpers/engine-process.js'
import { multipartBody } from '../helpers/multipart.js'
import { ensureBuilt } from '../helpers/processes.js'
import { requireRedis, startRedis } from '../helpers/redis.js'
import { RedisPortfolioStore } from '../../src/reference-engine/redis-store.js'
import { buildEngine } from '../../src/reference-engine/engine.js'
import type { Portfolio } from '../../src/reference-engine/store.js'

if (requireRedis(t)) {
  t.before(ensureBuilt)

  const silent = pino({ level: 'silent' })
  const png = readFileSync(PNG_IMAGE)

  /** A Redis client for looking at what the engines wrote. */
  function probeOf (t: Test, url: string): Redis {
    const probe = new Redis(url, { maxRetriesPerRequest: 0, retryStrategy: () => null, lazyConnect: false })
    t.teardown(() => probe.disconnect())
    return probe
  }

  /** Every key of a pattern, with SCAN as an operator would (never KEYS). */
  async function keysOf (probe: Redis, pattern: string): Promise<string[]> {
    const found: string[] = []
    let cursor = '0'
    do {
      const [next, keys] = await probe.scan(cursor, 'MATCH', pattern, 'COUNT', 1000)
      found.push(...keys)
      cursor = next
    } while (cursor !== '0')
    return found.sort()
  }

  /** A store of the test's own on `url`, connected. */
  async function store (t: Test, url: string): Promise<RedisPortfolioStore> {
    const s = new RedisPortfolioStore({ url, log: silent })
    t.teardown(() => s.close())
    await s.connected()
    return s
  }

  const portfolio = (id: string, owner: string): Portfolio => ({
    id,
    owner,
    name: 'P',
    type: 'PORTFOLIO',
    status: 'DRAFT',
    positions: [],
    target_positions: []
  })

  t.test(
    'the Redis store: keys tagged with the owner, exact allocations, one portfolio per owner and key across connections, key records that expire',
    async (t) => {
      const redis = await startRedis(t)
      const probe = probeOf(t, redis.url)
      const [a, b] = await Promise.all([store(t, redis.url), store(t, redis.url)])
      t.same(await a.state(), { database: 'connected', cache: 'connected' })

      const owner = 'we{ir}d:owner'
      // Two stores (two connections, as two engines) insert with one key at once: the script lets one win.
      const [firstRecord, secondRecord] = await Promise.all([
        a.insertOnce(portfolio('id-a', owner), 'key-1', 'form-a'),
        b.insertOnce(portfolio('id-b', owner), 'key-1', 'form-b')
      ])
      t.same(firstRecord, secondRecord, "both get the same record: one portfolio id, the winner's fingerprint")
      const first = firstRecord.portfolioId
      t.same(
        firstRecord,
        first === 'id-a'
          ? { portfolioId: 'id-a', fingerprint: 'form-a' }
          : { portfolioId: 'id-b', fingerprint: 'form-b' }
      )
      t.same(
        await keysOf(probe, 'pe:*'),
        ['pe:key:{we%7Bir%7Dd%3Aowner}:key-1', `pe:portfolio:{we%7Bir%7Dd%3Aowner}:${first}`],
        "one portfolio, one key record, both in the owner's hash tag"
      )
      t.same(await a.createdWithKey(owner, 'key-1'), firstRecord)
      t.equal(await a.createdWithKey(OTHER_USER, 'key-1'), undefined, 'keys are per owner')
      const ttlMs = await probe.pttl('pe:key:{we%7Bir%7Dd%3Aowner}:key-1')
      t.ok(ttlMs > 172_700_000 && ttlMs <= 172_800_000, `the key's record lives 48 h by default (PTTL ${ttlMs} ms)`)
      t.equal(await probe.pttl(`pe:portfolio:{we%7Bir%7Dd%3Aowner}:${first}`), -1, 'the portfolio itself never expires')

      // More digits than a double holds, on purpose: both sides must round them alike.
      /* eslint-disable @typescript-eslint/no-loss-of-precision */
      const targets = [
        { mint: MINTS[0], allocation: 0.123456789012345678 },
        { mint: MINTS[1], allocation: 1 - 0.123456789012345678 }
      ]
      /* eslint-enable @typescript-eslint/no-loss-of-precision */
      t.equal(await b.replaceTargets(first, owner, targets), true)
      t.same((await a.getOwned(first, owner))?.target_positions, targets, 'allocations come back exactly as given')
      t.equal(await a.replaceTargets(first, OTHER_USER, targets), false, 'a foreign owner finds nothing')
      t.equal(await a.getOwned(first, OTHER_USER), undefined)
      t.equal(await a.replaceTargets('no-such-id', owner, targets), false)

      // A key's record expires after the store's key lifetime; the portfolio stays, and the key may create again.
      const brief = new RedisPortfolioStore({ url: redis.url, log: silent, keyTtlMs: 300 })
      t.teardown(() => brief.close())
      await brief.connected()
      t.same(await brief.insertOnce(portfolio('id-1', USER), 'short-lived', 'form-1'), {
        portfolioId: 'id-1',
        fingerprint: 'form-1'
      })
      const shortTtlMs = await probe.pttl(`pe:key:{${USER}}:short-lived`)
      t.ok(shortTtlMs > 0 && shortTtlMs <= 300, `PTTL ${shortTtlMs} ms`)
      const gone = await attemptUntil(
        async () => await brief.createdWithKey(USER, 'short-lived'),
        (r) => r === undefined,
        10_000
      )
      t.equal(gone, undefined, 'the record is gone once its lifetime has passed')
      t.match(await brief.getOwned('id-1', USER), { id: 'id-1' }, 'the portfolio is not')
      t.same(
        await brief.insertOnce(portfolio('id-2', USER), 'short-lived', 'form-2'),
        { portfolioId: 'id-2', fingerprint: 'form-2' },
        'the key is free again'
      )

      // A record written before fingerprints (a bare id, no expiry) is still honoured, as the same form,
      // and from the first time it is read it expires after the key lifetime like any other record.
      await probe.set(`pe:key:{${USER}}:old-key`, 'old-portfolio-id')
      t.equal(await probe.pttl(`pe:key:{${USER}}:old-key`), -1, 'seeded without an expiry')
      t.same(await a.createdWithKey(USER, 'old-key'), { portfolioId: 'old-portfolio-id', fingerprint: undefined })
      const readTtlMs = await probe.pttl(`pe:key:{${USER}}:old-key`)
      t.ok(
        readTtlMs > 172_700_000 && readTtlMs <= 172_800_000,
        `a bare record read gets the key lifetime (PTTL ${readTtlMs} ms)`
      )
      await probe.set(`pe:key:{${USER}}:old-key-2`, 'old-portfolio-id-2')
      t.same(await a.insertOnce(portfolio('new-id', USER), 'old-key-2', 'form'), {
        portfolioId: 'old-portfolio-id-2',
        fingerprint: undefined
      })
      const insertTtlMs = await probe.pttl(`pe:key:{${USER}}:old-key-2`)
      t.ok(
        insertTtlMs > 172_700_000 && insertTtlMs <= 172_800_000,
        `a bare record met by a create gets the key lifetime (PTTL ${insertTtlMs} ms)`
      )
      t.equal(await a.getOwned('new-id', USER), undefined, 'and the create made nothing')
      // An expiry already set is left as it is (a record is never lengthened by being read).
      await probe.set(`pe:key:{${USER}}:old-key-3`, 'old-portfolio-id-3', 'PX', 60_000)
      await a.createdWithKey(USER, 'old-key-3')
      await a.insertOnce(portfolio('new-id-3', USER), 'old-key-3', 'form')
      const keptTtlMs = await probe.pttl(`pe:key:{${USER}}:old-key-3`)
      t.ok(keptTtlMs > 0 && keptTtlMs <= 60_000, `PTTL ${keptTtlMs} ms`)
    }
  )

  /** A create on `engine` whose last bytes wait for `release`, so several can be in flight at once. */
  function heldCreate (engine: EngineProcess, dispatcher: Agent, headers: Record<string, string>) {
    const { body, contentType } = multipartBody([
      { name: 'name', value: 'Shared' },
      { name: 'type', value: 'PORTFOLIO' },
      { name: 'image', filename: 'a.png', contentType: 'image/png', data: png }
    ])
    let release: () => void = () => {}
    const released = new Promise<void>((resolve) => {
      release = resolve
    })
    async function * chunks (): AsyncGenerator<Buffer> {
      yield body.subarray(0, body.length - 10)
      await released
      yield body.subarray(body.length - 10)
    }
    const answer = request(`${engine.url}/api/portfolio/create`, {
      dispatcher,
      method: 'POST',
      headers: { 'x-user-id': USER, 'content-type': contentType, 'content-length': String(body.length), ...headers },
      body: Readable.from(chunks())
    })
    return { answer, release }
  }

  async function create (
    engine: EngineProcess,
    dispatcher: Agent,
    user = USER
  ): Promise<{ status: number; text: string; headers: Record<string, unknown> }> {
    const { body, contentType } = multipartBody([
      { name: 'name', value: 'Shared' },
      { name: 'type', value: 'PORTFOLIO' },
      { name: 'image', filename: 'a.png', contentType: 'image/png', data: png }
    ])
    const res = await request(`${engine.url}/api/portfolio/create`, {
      dispatcher,
      method: 'POST',
      headers: { 'x-user-id': user, 'content-type': contentType },
      body
    })
    return { status: res.statusCode, text: await res.body.text(), headers: res.headers }
  }

  async function update (
    engine: EngineProcess,
    dispatcher: Agent,
    id: string,
    user = USER
  ): Promise<{ status: number; text: string; headers: Record<string, unknown> }> {
    const res = await request(`${engine.url}/api/portfolio/update`, {
      dispatcher,
      method: 'POST',
      headers: { 'x-user-id': user, 'content-type': 'application/json' },
      body: JSON.stringify({
        portfolio_id: id,
        target_positions: [
          { mint: MINTS[0], allocation: 0.25 },
          { mint: MINTS[2], allocation: 0.75 }
        ]
      })
    })
    return { status: res.statusCode, text: await res.body.text(), headers: res.headers }
  }

  async function health (engine: EngineProcess, dispatcher: Agent): Promise<{ status: number; body: unknown }> {
    const res = await request(`${engine.url}/health`, { dispatcher })
    return { status: res.statusCode, body: await res.body.json() }
  }

  t.test('two engines on one Redis and one image directory agree', async (t) => {
    const redis = await startRedis(t)
    const probe = probeOf(t, redis.url)
    const imageDir = newImageDir(t)
    const env = { ENGINE_REDIS_URL: redis.url, ENGINE_IMAGE_DIR: imageDir }
    const [a, b] = await Promise.all([startEngineProcess(t, env), startEngineProcess(t, env)])
    await Promise.all([a.waitFor(/portfolio store connected/), b.waitFor(/portfolio store connected/)])
    t.match(a.out(), /"store":"redis"/)
    t.notMatch(a.out() + b.out(), redis.url, 'the Redis URL is never logged')
    const dispatcher = new Agent({ keepAliveTimeout: 10 })
    t.teardown(() => dispatcher.close())

    for (const engine of [a, b]) {
      t.same(await health(engine, dispatcher), {
        status: 200,
        body: { status: 'ok', services: { database: 'connected', cache: 'connected' } }
      })
    }

    t.test('create on one, update on the other', async (t) => {
      const created = await create(a, dispatcher)
      t.equal(created.status, 200)
      const { portfolio_id: id } = JSON.parse(created.text) as { portfolio_id: string }
      const updated = await update(b, dispatcher, id)
      t.equal(updated.status, 200)
      t.same(JSON.parse(updated.text), { success: true, message: 'Target positions updated' })
      const stored = await (await store(t, redis.url)).getOwned(id, USER)
      t.match(stored, {
        id,
        owner: USER,
        status: 'DRAFT',
        positions: [],
        image: { path: `${imageDir}/${id}.png`, mime: 'image/png', bytes: png.length }
      })
      t.same(
        stored?.target_positions,
        [
          { mint: MINTS[0], allocation: 0.25 },
          { mint: MINTS[2], allocation: 0.75 }
        ],
        'engine B changed what engine A created'
      )
      t.ok(readdirSync(imageDir).includes(`${id}.png`), 'the image is in the shared directory')

      // DECISIONS 1: a foreign owner and an unknown id get the same 404 from either engine.
      const notFound =
        '{"success":false,"error":{"source":"portfolio-engine","code":"NOT_FOUND","message":"portfolio_id does not name a portfolio of this user","function":"updatePortfolio"}}'
      for (const engine of [a, b]) {
        const foreign = await update(engine, dispatcher, id, OTHER_USER)
        t.equal(foreign.status, 404)
        t.equal(foreign.text, notFound)
        const unknown = await update(engine, dispatcher, 'no-such-portfolio')
        t.equal(unknown.status, 404)
        t.equal(unknown.text, notFound)
      }
      t.same(
        (await (await store(t, redis.url)).getOwned(id, USER))?.target_positions,
        stored?.target_positions,
        'the foreign update changed nothing'
      )
    })

    t.test('one owner and key sent to both engines at once: one portfolio', async (t) => {
      const key = 'same-key-on-both'
      const createLine = /"url":"\/api\/portfolio\/create"/
      const [seenA, seenB] = [a.count(createLine), b.count(createLine)]
      const onA = heldCreate(a, dispatcher, { 'idempotency-key': key })
      const onB = heldCreate(b, dispatcher, { 'idempotency-key': key })
      // Both requests are in flight, their forms all but complete, before either may finish.
      await Promise.all([a.waitFor(createLine, seenA + 1), b.waitFor(createLine, seenB + 1)])
      onA.release()
      onB.release()
      const answers = await Promise.all([onA.answer, onB.answer])
      t.same(
        answers.map((r) => r.statusCode),
        [200, 200]
      )
      const [idA, idB] = await Promise.all(
        answers.map(async (r) => ((await r.body.json()) as { portfolio_id: string }).portfolio_id)
      )
      t.equal(idA, idB, 'both engines answer the same portfolio id')
      t.same(await keysOf(probe, `pe:key:{${USER}}:${key}`), [`pe:key:{${USER}}:${key}`])
      t.match(
        JSON.parse((await probe.get(`pe:key:{${USER}}:${key}`)) ?? '{}'),
        { portfolio_id: idA, fingerprint: /^[\w-]{43}$/ },
        "the key's record: the portfolio and the form's fingerprint"
      )
      const portfolios = await keysOf(probe, `pe:portfolio:{${USER}}:*`)
      t.equal(portfolios.length, 2, 'one portfolio from this key, beside the one of the test before')
      t.ok(portfolios.includes(`pe:portfolio:{${USER}}:${idA!}`))
      const files = readdirSync(imageDir)
      t.equal(files.filter((f) => f.startsWith('.upload-')).length, 0, 'no temporary upload is left')
      t.equal(files.length, 2, 'one image per portfolio: the losing upload was removed')
      t.ok(files.includes(`${idA!}.png`))
    })

    t.test(
      'a key reused with a different form is 422 on either engine; the same form is the same portfolio',
      async (t) => {
        const key = 'reused-across-engines'
        const form = (name: string, image: Buffer) =>
          multipartBody([
            { name: 'type', value: 'PORTFOLIO' },
            { name: 'name', value: name },
            { name: 'image', filename: 'a.png', contentType: 'image/png', data: image }
          ])
        const send = async (engine: EngineProcess, { body, contentType }: { body: Buffer; contentType: string }) => {
          const res = await request(`${engine.url}/api/portfolio/create`, {
            dispatcher,
            method: 'POST',
            headers: { 'x-user-id': USER, 'content-type': contentType, 'idempotency-key': key },
            body
          })
          return { status: res.statusCode, text: await res.body.text() }
        }
        const created = await send(a, form('Reused', png))
        t.equal(created.status, 200)
        const { portfolio_id: id } = JSON.parse(created.text) as { portfolio_id: string }
        const reused =
          '{"success":false,"error":{"source":"portfolio-engine","code":"IDEMPOTENCY_KEY_REUSED","message":"this Idempotency-Key was used for a different request","function":"createPortfolio"}}'
        const otherName = await send(b, form('Another name', png))
        t.equal(otherName.status, 422, 'another field value')
        t.equal(otherName.text, reused)
        const otherImage = Buffer.concat([png, Buffer.from('trailing bytes change the digest')])
        const otherBytes = await send(b, form('Reused', otherImage))
        t.equal(otherBytes.status, 422, 'other image bytes')
        t.equal(otherBytes.text, reused)
        // The same fields in another order, under another boundary: the same form.
        const reordered = multipartBody([
          { name: 'image', filename: 'b.png', contentType: 'image/png', data: png },
          { name: 'name', value: 'Reused' },
          { name: 'type', value: 'PORTFOLIO' }
        ])
        const same = await send(b, reordered)
        t.equal(same.status, 200)
        t.same(
          JSON.parse(same.text),
          { portfolio_id: id },
          'the same form on the other engine: the portfolio the key made'
        )
        t.equal(
          (await keysOf(probe, `pe:portfolio:{${USER}}:*`)).length,
          3,
          'no portfolio from the refused or repeated forms'
        )
        t.equal(readdirSync(imageDir).length, 3, 'and no image either')
      }
    )
  })

  t.test(
    'Redis down: /health 200 says disconnected, create and update 503; Redis back: connected, creates work',
    async (t) => {
      const redis = await startRedis(t)
      const imageDir = newImageDir(t)
      const engine = await startEngineProcess(t, { ENGINE_REDIS_URL: redis.url, ENGINE_IMAGE_DIR: imageDir })
      await engine.waitFor(/portfolio store connected/)
      const dispatcher = new Agent({ keepAliveTimeout: 10 })
      t.teardown(() => dispatcher.close())
      const created = await create(engine, dispatcher)
      t.equal(created.status, 200)
      const { portfolio_id: id } = JSON.parse(created.text) as { portfolio_id: string }

      await redis.kill()
      await engine.waitFor(/portfolio store unavailable/)
      t.same(await health(engine, dispatcher), {
        status: 200,
        body: { status: 'degraded', services: { database: 'disconnected', cache: 'disconnected' } }
      })

      const unavailable = (fn: string): string =>
        `{"success":false,"error":{"source":"portfolio-engine","code":"SERVICE_UNAVAILABLE","message":"portfolio store unavailable, retry later","function":"${fn}"}}`
      const refusedCreate = await create(engine, dispatcher)
      t.equal(refusedCreate.status, 503)
      t.equal(refusedCreate.headers['retry-after'], '1')
      t.equal(refusedCreate.text, unavailable('createPortfolio'))
      t.same(readdirSync(imageDir), [`${id}.png`], 'the refused upload left no file')
      const refusedUpdate = await update(engine, dispatcher, id)
      t.equal(refusedUpdate.status, 503)
      t.equal(refusedUpdate.headers['retry-after'], '1')
      t.equal(refusedUpdate.text, unavailable('updatePortfolio'))
      t.notMatch(
        engine.out(),
        /"msg":"engine request failed"/,
        'an outage is logged as a refusal, not as a failure with a stack'
      )

      await redis.restart()
      await engine.waitFor(/portfolio store connected/, 2)
      t.same(await health(engine, dispatcher), {
        status: 200,
        body: { status: 'ok', services: { database: 'connected', cache: 'connected' } }
      })
      const again = await create(engine, dispatcher)
      t.equal(again.status, 200, 'creates work again once Redis is back')
    }
  )

  t.test(
    'draining on Redis: an upload in flight at SIGTERM is still stored, since the store closes after the last request',
    async (t) => {
      const redis = await startRedis(t)
      const engine = await startEngineProcess(t, { ENGINE_REDIS_URL: redis.url })
      await engine.waitFor(/portfolio store connected/)
      const dispatcher = new Agent({ keepAliveTimeout: 10 })
      t.teardown(() => dispatcher.close())
      const held = heldCreate(engine, dispatcher, { 'idempotency-key': 'in-flight-at-sigterm' })
      await engine.waitFor(/"url":"\/api\/portfolio\/create"/)
      engine.proc.kill('SIGTERM')
      await engine.waitFor(/stopped accepting connections/)
      held.release()
      const answer = await held.answer
      t.equal(answer.statusCode, 200)
      const { portfolio_id: id } = (await answer.body.json()) as { portfolio_id: string }
      t.same(await engine.exited, [0, null])
      t.match(
        await (await store(t, redis.url)).getOwned(id, USER),
        { id, owner: USER, name: 'Shared' },
        'the portfolio is in Redis'
      )
    }
  )

  t.test(
    'buildEngine({ redisUrl }): the store is Redis, so the synchronous memory view refuses to be read',
    async (t) => {
      const redis = await startRedis(t)
      const engine = await buildEngine({ imageDir: newImageDir(t), redisUrl: redis.url })
      t.teardown(() => engine.close())
      t.ok(engine.portfolioStore instanceof RedisPortfolioStore)
      t.throws(() => engine.portfolios.size, new Error('this engine keeps its portfolios in Redis: use portfolioStore'))
    }
  )

  t.test(
    'an engine started while Redis is down starts, says disconnected, and connects when Redis comes',
    async (t) => {
      const redis = await startRedis(t)
      await redis.kill()
      const engine = await startEngineProcess(t, { ENGINE_REDIS_URL: redis.url })
      const dispatcher = new Agent({ keepAliveTimeout: 10 })
      t.teardown(() => dispatcher.close())
      t.same(await health(engine, dispatcher), {
        status: 200,
        body: { status: 'degraded', services: { database: 'disconnected', cache: 'disconnected' } }
      })
      await redis.restart()
      await engine.waitFor(/portfolio store connected/)
      t.same(await health(engine, dispatcher), {
        status: 200,
        body: { status: 'ok', services: { database: 'connected', cache: 'connected' } }
      })
    }
  )
}
