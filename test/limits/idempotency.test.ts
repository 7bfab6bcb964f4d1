/**
 * Idempotency-Key on update and create (DECISIONS 16), in-process store, over
 * real sockets against the stub engine: replay byte for byte, 409 in flight,
 * 422 for another request, the gateway's own errors never stored.
 */
import { readFileSync } from 'node:fs'
import t from 'tap'
import { request } from 'undici'
import { PNG_IMAGE, JPEG_IMAGE } from '../../fixtures/images.js'
import { contractHandler, faults, json, startStubUpstream, type StubHandler } from '../../fixtures/stub-upstream.js'
import { bearer, build, hs256, MINTS, validUpdate } from '../helpers/app.js'
import { multipartBody, type MultipartPart } from '../helpers/multipart.js'
import { metricOf } from '../helpers/prometheus.js'

async function post (url: string, body: string | Buffer, headers: Record<string, string>) {
  const res = await request(url, { method: 'POST', headers, body })
  const raw = Buffer.from(await res.body.arrayBuffer())
  return { status: res.statusCode, headers: res.headers, raw, json: JSON.parse(raw.toString('utf8')) as unknown }
}

const updateWith = (url: string, body: unknown, key?: string, token = hs256()) =>
  post(`${url}/api/portfolio/update`, typeof body === 'string' ? body : JSON.stringify(body), {
    ...bearer(token),
    'content-type': 'application/json',
    ...(key === undefined ? {} : { 'idempotency-key': key })
  })

const structured = (code: string, message: string, fn: string) => ({
  success: false,
  error: { source: 'portfolio-gateway', code, message, function: fn }
})

t.test('Idempotency-Key syntax: 1-255 visible ASCII, bare or quoted; else 400 naming the header', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(() => stub.close())
  const { url } = await build(t, { upstreamUrl: stub.url })
  const message =
    'Idempotency-Key header must be given once, as 1 to 255 visible ASCII characters, bare or in double quotes'
  for (const bad of ['a'.repeat(256), 'has space', '""', '"unclosed', 'caf\u00e9']) {
    const res = await post(`${url}/api/portfolio/update`, JSON.stringify(validUpdate()), {
      ...bearer(),
      'content-type': 'application/json',
      'idempotency-key': bad === 'caf\u00e9' ? 'caf\u00c3\u00a9' : bad
    })
    t.equal(res.status, 400, JSON.stringify(bad))
    t.same(res.json, structured('VALIDATION_ERROR', message, 'updatePortfolio'))
  }
  const form = multipartBody([{ name: 'name', value: 'x' }])
  const create = await post(`${url}/api/portfolio/create`, form.body, {
    ...bearer(),
    'content-type': form.contentType,
    'idempotency-key': 'two words'
  })
  t.equal(create.status, 400)
  t.same(create.json, structured('VALIDATION_ERROR', message, 'createPortfolio'))
  t.equal(stub.requests.length, 0, 'nothing reached the engine')

  // 255 characters, the whole visible range, is a key.
  const longest = Array.from({ length: 255 }, (_, i) => String.fromCharCode(0x21 + (i % 94))).join('')
  t.equal((await updateWith(url, validUpdate(), longest)).status, 200)
  t.equal(stub.requests[0]!.headers['idempotency-key'], longest, 'the key goes on to the engine')
})

t.test(
  'update: a retry is replayed byte for byte and not forwarded; another body is 422; another user is separate',
  async (t) => {
    const stub = await startStubUpstream()
    t.teardown(() => stub.close())
    const { metrics, url } = await build(t, { upstreamUrl: stub.url })

    const first = await updateWith(url, validUpdate(), 'k-1')
    t.equal(first.status, 200)
    t.equal(first.headers['idempotent-replayed'], undefined)
    t.equal(stub.requests.length, 1)
    t.equal(stub.requests[0]!.headers['idempotency-key'], 'k-1', 'the key goes to the engine bare')

    // The same request: quoted key, keys of the JSON in another order.
    const u = validUpdate()
    const reordered = `{"target_positions":${JSON.stringify(u.target_positions)},"portfolio_id":"${u.portfolio_id}"}`
    const retry = await updateWith(url, reordered, '"k-1"')
    t.equal(retry.status, 200)
    t.equal(retry.headers['idempotent-replayed'], 'true')
    t.same(retry.raw, first.raw, 'the stored body, byte for byte')
    t.equal(retry.headers['content-type'], first.headers['content-type'])
    t.equal(stub.requests.length, 1, 'the retry did not reach the engine')

    const other = await updateWith(url, { ...u, target_positions: [{ mint: MINTS[0], allocation: 1 }] }, 'k-1')
    t.equal(other.status, 422)
    t.same(
      other.json,
      structured('IDEMPOTENCY_KEY_REUSED', 'this Idempotency-Key was used for a different request', 'updatePortfolio')
    )

    // Records are per subject and key, across both routes.
    const form = multipartBody([
      { name: 'name', value: 'Alpha' },
      { name: 'type', value: 'PORTFOLIO' }
    ])
    const onCreate = await post(`${url}/api/portfolio/create`, form.body, {
      ...bearer(),
      'content-type': form.contentType,
      'idempotency-key': 'k-1'
    })
    t.equal(onCreate.status, 422)
    t.same(
      onCreate.json,
      structured('IDEMPOTENCY_KEY_REUSED', 'this Idempotency-Key was used for a different request', 'createPortfolio')
    )

    const bob = await updateWith(url, validUpdate(), 'k-1', hs256({ sub: 'bob' }))
    t.equal(bob.status, 200)
    t.equal(bob.headers['idempotent-replayed'], undefined, 'another user has keys of their own')
    t.equal(stub.requests.length, 2)

    // Without the header: exactly as before, every call reaches the engine.
    await updateWith(url, validUpdate())
    await updateWith(url, validUpdate())
    t.equal(stub.requests.length, 4)
    t.equal(stub.requests[3]!.headers['idempotency-key'], undefined)

    const counted = async (outcome: string): Promise<number | undefined> =>
      metricOf(metrics, 'gateway_idempotency_total', { outcome })
    t.equal(await counted('replay'), 1, 'one replay counted')
    t.equal(await counted('conflict'), 2, 'the other body and the create with the same key')
    t.equal(await counted('in_flight'), 0)
    t.equal(await counted('store_unavailable'), 0)
  }
)

t.test("update: the engine's structured error is stored; the gateway's own 502 is not", async (t) => {
  const stub = await startStubUpstream()
  t.teardown(() => stub.close())
  const { url } = await build(t, { upstreamUrl: stub.url })

  stub.handle((_req, res) =>
    json(res, 404, {
      success: false,
      error: { source: 'engine', code: 'NOT_FOUND', message: 'no such portfolio', function: 'updatePortfolio' }
    })
  )
  const first = await updateWith(url, validUpdate(), 'k-404')
  t.equal(first.status, 404)
  stub.handle(contractHandler)
  const retry = await updateWith(url, validUpdate(), 'k-404')
  t.equal(retry.status, 404)
  t.equal(retry.headers['idempotent-replayed'], 'true')
  t.same(retry.raw, first.raw)
  t.equal(stub.requests.length, 1)

  stub.handle(faults.reset)
  const failed = await updateWith(url, validUpdate(), 'k-502')
  t.equal(failed.status, 502)
  stub.handle(contractHandler)
  const again = await updateWith(url, validUpdate(), 'k-502')
  t.equal(again.status, 200, 'the claim was released: the retry reaches the engine')
  t.equal(again.headers['idempotent-replayed'], undefined)

  // A gateway 400 does not claim the key either.
  t.equal((await updateWith(url, { portfolio_id: 'p-1', target_positions: [] }, 'k-400')).status, 400)
  t.equal((await updateWith(url, validUpdate(), 'k-400')).status, 200)
})

t.test(
  "update: the engine's 503 goes out as the gateway's 503 and is not stored: the retry reaches the engine",
  async (t) => {
    const stub = await startStubUpstream()
    t.teardown(() => stub.close())
    const { url } = await build(t, { upstreamUrl: stub.url })
    const unavailable = {
      success: false,
      error: {
        source: 'portfolio-engine',
        code: 'SERVICE_UNAVAILABLE',
        message: 'portfolio store unavailable, retry later',
        function: 'updatePortfolio'
      }
    }
    stub.handle((_req, res) => {
      res.setHeader('retry-after', '7')
      json(res, 503, unavailable)
    })
    const first = await updateWith(url, validUpdate(), 'k-503')
    t.equal(first.status, 503)
    t.same(
      first.json,
      { error: 'portfolio engine unavailable, retry later' },
      "the engine's 503 in the simple shape, as every 503"
    )
    t.equal(first.headers['retry-after'], '7', "with the engine's Retry-After")
    stub.handle(contractHandler)
    const retry = await updateWith(url, validUpdate(), 'k-503')
    t.equal(retry.status, 200, 'the retry reached the engine')
    t.equal(retry.headers['idempotent-replayed'], undefined)
    t.equal(stub.requests.length, 2)
    const replay = await updateWith(url, validUpdate(), 'k-503')
    t.equal(replay.headers['idempotent-replayed'], 'true', 'the 200 is the stored answer')
    t.equal(stub.requests.length, 2)
  }
)

t.test('update: the same key while the first is in flight is 409', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(() => stub.close())
  const { metrics, url } = await build(t, { upstreamUrl: stub.url, env: { UPSTREAM_TIMEOUT_MS: '5000' } })
  let release: (() => void) | undefined
  const held = new Promise<void>((resolve) => {
    release = resolve
  })
  const arrived = new Promise<void>((resolve) => {
    stub.handle(((req, res, body) => {
      resolve()
      void held.then(() => contractHandler(req, res, body))
    }) as StubHandler)
  })
  const first = updateWith(url, validUpdate(), 'k-busy')
  await arrived
  const second = await updateWith(url, validUpdate(), 'k-busy')
  t.equal(second.status, 409)
  t.same(
    second.json,
    structured('IDEMPOTENCY_KEY_IN_USE', 'a request with this Idempotency-Key is still in progress', 'updatePortfolio')
  )
  release!()
  t.equal((await first).status, 200)
  const third = await updateWith(url, validUpdate(), 'k-busy')
  t.equal(third.headers['idempotent-replayed'], 'true')
  t.equal(stub.requests.length, 1)
  t.equal(await metricOf(metrics, 'gateway_idempotency_total', { outcome: 'in_flight' }), 1, 'the 409 counted')
  t.equal(await metricOf(metrics, 'gateway_idempotency_total', { outcome: 'replay' }), 1)
})

t.test(
  'create: a retry with another boundary and part order is read, hashed and replayed, never forwarded',
  async (t) => {
    const stub = await startStubUpstream()
    t.teardown(() => stub.close())
    const { url } = await build(t, { upstreamUrl: stub.url })
    const png = readFileSync(PNG_IMAGE)
    const image: MultipartPart = { name: 'image', filename: 'a.png', contentType: 'image/png', data: png }
    const fields: MultipartPart[] = [
      { name: 'name', value: 'Alpha' },
      { name: 'type', value: 'PORTFOLIO' }
    ]
    const create = (parts: MultipartPart[], key: string, boundary?: string) => {
      const form = multipartBody(parts, boundary)
      return post(`${url}/api/portfolio/create`, form.body, {
        ...bearer(),
        'content-type': form.contentType,
        'idempotency-key': key
      })
    }

    const first = await create([...fields, image], 'c-1', 'boundary-one')
    t.equal(first.status, 200)
    t.same(first.json, { portfolio_id: 'p-stub-1' })
    t.equal(stub.requests.length, 1)
    t.equal(stub.requests[0]!.headers['idempotency-key'], 'c-1')

    const retry = await create([image, fields[1]!, fields[0]!], 'c-1', 'another-boundary')
    t.equal(retry.status, 200)
    t.equal(retry.headers['idempotent-replayed'], 'true')
    t.same(retry.raw, first.raw)
    t.equal(stub.requests.length, 1, 'the retry was not forwarded')
    t.equal(stub.stats.started, 1)

    const otherImage = await create(
      [...fields, { ...image, contentType: 'image/jpeg', data: readFileSync(JPEG_IMAGE) }],
      'c-1'
    )
    t.equal(otherImage.status, 422)
    t.same(
      otherImage.json,
      structured('IDEMPOTENCY_KEY_REUSED', 'this Idempotency-Key was used for a different request', 'createPortfolio')
    )
    const otherField = await create([{ name: 'name', value: 'Beta' }, fields[1]!, image], 'c-1')
    t.equal(otherField.status, 422)

    // The replayed path still checks the form: a bad one is a 400, not a replay.
    const invalid = await create([...fields, { ...image, data: Buffer.from('not an image at all') }], 'c-1')
    t.equal(invalid.status, 400)
    t.equal(stub.requests.length, 1)

    // Without an image: same logic on the buffered form.
    const noImage = await create(fields, 'c-2')
    t.equal(noImage.status, 200)
    const noImageRetry = await create([fields[1]!, fields[0]!], 'c-2')
    t.equal(noImageRetry.headers['idempotent-replayed'], 'true')
    t.equal(stub.requests.length, 2)
  }
)

t.test('create: in flight is 409; a 400 mid-upload releases the key', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(() => stub.close())
  const { url } = await build(t, { upstreamUrl: stub.url, env: { UPSTREAM_TIMEOUT_MS: '5000' } })
  const fields: MultipartPart[] = [
    { name: 'name', value: 'Alpha' },
    { name: 'type', value: 'PORTFOLIO' }
  ]
  const form = multipartBody(fields)
  const headers = { ...bearer(), 'content-type': form.contentType, 'idempotency-key': 'c-busy' }

  let release: (() => void) | undefined
  const held = new Promise<void>((resolve) => {
    release = resolve
  })
  const arrived = new Promise<void>((resolve) => {
    stub.handle(((req, res, body) => {
      resolve()
      void held.then(() => contractHandler(req, res, body))
    }) as StubHandler)
  })
  const first = post(`${url}/api/portfolio/create`, form.body, headers)
  await arrived
  const second = await post(`${url}/api/portfolio/create`, form.body, headers)
  t.equal(second.status, 409)
  t.same(
    second.json,
    structured('IDEMPOTENCY_KEY_IN_USE', 'a request with this Idempotency-Key is still in progress', 'createPortfolio')
  )
  release!()
  t.equal((await first).status, 200)

  const bad = multipartBody([
    { name: 'name', value: 'Alpha' },
    { name: 'type', value: 'NOT_A_TYPE' }
  ])
  t.equal(
    (
      await post(`${url}/api/portfolio/create`, bad.body, {
        ...bearer(),
        'content-type': bad.contentType,
        'idempotency-key': 'c-bad'
      })
    ).status,
    400
  )
  const good = await post(`${url}/api/portfolio/create`, form.body, { ...headers, 'idempotency-key': 'c-bad' })
  t.equal(good.status, 200)
  t.equal(good.headers['idempotent-replayed'], undefined, 'the 400 was not stored')
})
