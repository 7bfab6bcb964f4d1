import { readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import { GIF_IMAGE, JPEG_IMAGE, PNG_IMAGE } from '../../fixtures/images.js'
import { CREATE_FORM_LIMITS } from '../../schemas/portfolio.js'
import { MINTS, USER, attemptUntil, startEngine } from '../helpers/engine.js'
import { multipartBody, type MultipartPart } from '../helpers/multipart.js'

const structured = (code: string, message: string) => ({ success: false, error: { source: 'portfolio-engine', code, message, function: 'createPortfolio' } })
const png = readFileSync(PNG_IMAGE)
const jpeg = readFileSync(JPEG_IMAGE)
const REQUIRED: MultipartPart[] = [{ name: 'name', value: 'Blue chips' }, { name: 'type', value: 'PORTFOLIO' }]

type Engine = Awaited<ReturnType<typeof startEngine>>

async function create (engine: Engine, parts: MultipartPart[], headers: Record<string, string> = {}) {
  const { body, contentType } = multipartBody(parts)
  return await engine.call('/api/portfolio/create', { method: 'POST', headers: { 'content-type': contentType, 'x-user-id': USER, ...headers }, body })
}

function portfolioIdOf (res: { status: number, json: unknown }): string {
  return (res.json as { portfolio_id: string }).portfolio_id
}

t.test('create without an image records a DRAFT portfolio', async (t) => {
  const engine = await startEngine(t)
  const res = await create(engine, [
    { name: 'name', value: 'Index of five' },
    { name: 'type', value: 'INDEX_PORTFOLIO' },
    { name: 'beneficiary_wallet', value: MINTS[1] },
    { name: 'description', value: 'Tracks five tokens' }
  ])
  t.equal(res.status, 200)
  const id = portfolioIdOf(res)
  t.match(id, /^[0-9a-f-]{36}$/)
  t.same(res.json, { portfolio_id: id })
  t.same(engine.engine.portfolios.get(id), {
    id,
    owner: USER,
    name: 'Index of five',
    type: 'INDEX_PORTFOLIO',
    beneficiary_wallet: MINTS[1],
    description: 'Tracks five tokens',
    status: 'DRAFT',
    positions: [],
    target_positions: []
  })
  t.same(readdirSync(engine.imageDir), [])
})

t.test('create stores a PNG and a JPEG under the portfolio id, byte for byte', async (t) => {
  const engine = await startEngine(t)
  // The declared type and name are wrong on purpose: the content decides (DECISIONS 5).
  const cases = [{ data: png, ext: 'png', mime: 'image/png' }, { data: jpeg, ext: 'jpg', mime: 'image/jpeg' }]
  for (const { data, ext, mime } of cases) {
    const res = await create(engine, [...REQUIRED, { name: 'image', filename: 'picture.gif', contentType: 'application/octet-stream', data }])
    t.equal(res.status, 200, ext)
    const id = portfolioIdOf(res)
    const path = join(engine.imageDir, `${id}.${ext}`)
    t.same(readFileSync(path), data, `${ext} bytes`)
    t.same(engine.engine.portfolios.get(id)?.image, { path, mime, bytes: data.length })
  }
  t.equal(readdirSync(engine.imageDir).length, 2, 'no temporary files left')
})

t.test('the image may come before the text fields', async (t) => {
  const engine = await startEngine(t)
  const res = await create(engine, [{ name: 'image', filename: 'a.png', contentType: 'image/png', data: png }, ...REQUIRED])
  t.equal(res.status, 200)
  t.same(readdirSync(engine.imageDir), [`${portfolioIdOf(res)}.png`])
})

t.test('a 500-character description of 3-byte characters fits', async (t) => {
  const engine = await startEngine(t)
  const description = '漢'.repeat(500)
  const res = await create(engine, [...REQUIRED, { name: 'description', value: description }])
  t.equal(res.status, 200)
  t.equal(engine.engine.portfolios.get(portfolioIdOf(res))?.description, description)
})

t.test('invalid forms are a 400 naming the field, and leave nothing behind', async (t) => {
  const engine = await startEngine(t)
  const image = { name: 'image', filename: 'a.png', contentType: 'image/png', data: png }
  const cases: Array<[string, MultipartPart[], string]> = [
    ['no fields', [], 'name is required'],
    ['missing type', [{ name: 'name', value: 'A' }, image], 'type is required'],
    ['empty name', [{ name: 'name', value: '' }, { name: 'type', value: 'PORTFOLIO' }], 'name must be at least 1 character'],
    ['long name', [{ name: 'name', value: 'x'.repeat(31) }, { name: 'type', value: 'PORTFOLIO' }, image], 'name must be at most 30 characters'],
    ['bad type', [{ name: 'name', value: 'A' }, { name: 'type', value: 'FUND' }], 'type must be one of PORTFOLIO, INDEX_PORTFOLIO'],
    ['bad wallet', [...REQUIRED, { name: 'beneficiary_wallet', value: '0'.repeat(40) }, image], 'beneficiary_wallet must be a base58 Solana address (32 bytes)'],
    ['long description', [...REQUIRED, { name: 'description', value: 'd'.repeat(501) }], 'description must be at most 500 characters'],
    ['unknown field', [...REQUIRED, { name: 'owner', value: 'mallory' }], 'owner is not an accepted field'],
    ['repeated field', [...REQUIRED, { name: 'name', value: 'B' }], 'name must be given once'],
    ['text image', [...REQUIRED, { name: 'image', value: 'not a file' }], 'image must be a file'],
    ['other file field', [...REQUIRED, { name: 'avatar', filename: 'a.png', contentType: 'image/png', data: png }], 'avatar is not an accepted file field (only image)'],
    ['gif', [...REQUIRED, { name: 'image', filename: 'a.png', contentType: 'image/png', data: readFileSync(GIF_IMAGE) }], 'image must be a PNG or JPEG file'],
    ['empty image', [...REQUIRED, { name: 'image', filename: 'a.png', contentType: 'image/png', data: Buffer.alloc(0) }], 'image must be a PNG or JPEG file'],
    ['png prefix only', [...REQUIRED, { name: 'image', filename: 'a.png', contentType: 'image/png', data: png.subarray(0, 4) }], 'image must be a PNG or JPEG file'],
    ['two images', [...REQUIRED, image, image], 'image must be given once'],
    ['a file part without a name', [...REQUIRED, { name: undefined, filename: 'a.png', contentType: 'image/png', data: png }], 'form part has no name'],
    ['a text part without a name', [...REQUIRED, { name: undefined, value: 'x' }], 'form part has no name'],
    ['a broken JSON part is text, checked as such', [{ name: 'name', value: '{"a":', contentType: 'application/json' }, { name: 'type', value: '["PORTFOLIO"]', contentType: 'application/json' }], 'type must be one of PORTFOLIO, INDEX_PORTFOLIO'],
    ['five fields', [...REQUIRED, { name: 'description', value: 'd' }, { name: 'beneficiary_wallet', value: MINTS[0] }, { name: 'extra', value: 'e' }], 'form must have at most 4 text fields'],
    ['field too long for the parser', [...REQUIRED, { name: 'description', value: 'd'.repeat(CREATE_FORM_LIMITS.fieldSize + 1) }], `description is longer than ${CREATE_FORM_LIMITS.fieldSize} bytes`]
  ]
  for (const [name, parts, message] of cases) {
    const res = await create(engine, parts)
    t.equal(res.status, 400, name)
    t.same(res.json, structured('VALIDATION_ERROR', message), name)
  }
  t.equal(engine.engine.portfolios.size, 0)
  t.same(readdirSync(engine.imageDir), [])
})

t.test('an image over 10 MiB is a 400 and is not kept', async (t) => {
  const engine = await startEngine(t)
  const big = Buffer.concat([png, Buffer.alloc(10 * 1024 * 1024 + 1 - png.length)])
  const res = await create(engine, [...REQUIRED, { name: 'image', filename: 'big.png', contentType: 'image/png', data: big }])
  t.equal(res.status, 400)
  t.same(res.json, structured('VALIDATION_ERROR', 'image must be at most 10485760 bytes'))
  t.same(readdirSync(engine.imageDir), [])
  t.equal(engine.engine.portfolios.size, 0)

  const exact = await create(engine, [...REQUIRED, { name: 'image', filename: 'max.png', contentType: 'image/png', data: big.subarray(0, 10 * 1024 * 1024) }])
  t.equal(exact.status, 200, 'exactly 10 MiB is allowed')
})

t.test('a body that is not well-formed multipart is a 400', async (t) => {
  const engine = await startEngine(t)
  const post = async (contentType: string, body: Buffer) => await engine.call('/api/portfolio/create', { method: 'POST', headers: { 'content-type': contentType, 'x-user-id': USER }, body })

  const { body, contentType } = multipartBody([...REQUIRED, { name: 'image', filename: 'a.png', contentType: 'image/png', data: png }])
  // Cut inside the image: the request completes but the part never closes.
  const cut = await post(contentType, body.subarray(0, body.length - 40))
  t.equal(cut.status, 400)
  t.match(cut.json, { success: false, error: { code: 'VALIDATION_ERROR', function: 'createPortfolio', message: /^multipart body is malformed: / } })

  const json = await post('application/json', Buffer.from('{"name":"A","type":"PORTFOLIO"}'))
  t.equal(json.status, 400)
  t.same(json.json, structured('VALIDATION_ERROR', 'content-type must be multipart/form-data'))

  t.equal(engine.engine.portfolios.size, 0)
  t.same(readdirSync(engine.imageDir), [])
})

t.test('a disk failure is a 500 that hides the path', async (t) => {
  const engine = await startEngine(t)
  // Replace the image directory with a file: mkdir and the write both fail.
  rmSync(engine.imageDir, { recursive: true })
  writeFileSync(engine.imageDir, 'not a directory')
  const res = await create(engine, [...REQUIRED, { name: 'image', filename: 'a.png', contentType: 'image/png', data: png }])
  t.equal(res.status, 500)
  t.same(res.json, structured('INTERNAL_ERROR', 'Internal error'))
  t.equal(engine.engine.portfolios.size, 0)
})

t.test('idempotency-key: one owner and key never create two portfolios, even concurrently (DECISIONS 16)', async (t) => {
  const engine = await startEngine(t)
  const withImage = [...REQUIRED, { name: 'image', filename: 'a.png', contentType: 'image/png', data: png }]
  const first = await create(engine, withImage, { 'idempotency-key': 'k-1' })
  t.equal(first.status, 200)
  const again = await create(engine, withImage, { 'idempotency-key': 'k-1' })
  t.same(again.json, first.json, 'the repeat answers the portfolio the key created')

  const concurrent = await Promise.all(Array.from({ length: 5 }, async () => await create(engine, withImage, { 'idempotency-key': 'k-2' })))
  const ids = new Set(concurrent.map(portfolioIdOf))
  t.equal(ids.size, 1, 'five concurrent creates with one key: one portfolio')
  t.equal(engine.engine.portfolios.size, 2)
  t.equal(readdirSync(engine.imageDir).length, 2, 'the repeats left no image behind')

  const otherOwner = await create(engine, withImage, { 'idempotency-key': 'k-1', 'x-user-id': 'user-bob' })
  t.not(portfolioIdOf(otherOwner), portfolioIdOf(first), 'keys are per owner')
  const noKey = await create(engine, withImage)
  t.not(portfolioIdOf(noKey), portfolioIdOf(first))
  t.equal(engine.engine.portfolios.size, 4)
})

t.test('idempotency-key with a different form: 422 IDEMPOTENCY_KEY_REUSED, nothing created (DECISIONS 16)', async (t) => {
  const engine = await startEngine(t)
  const form = (name: string, image: Buffer) => [{ name: 'type', value: 'PORTFOLIO' }, { name: 'name', value: name }, { name: 'image', filename: 'a.png', contentType: 'image/png', data: image }]
  const first = await create(engine, form('Blue chips', png), { 'idempotency-key': 'k-form' })
  t.equal(first.status, 200)
  const reused = structured('IDEMPOTENCY_KEY_REUSED', 'this Idempotency-Key was used for a different request')
  const otherField = await create(engine, form('Other chips', png), { 'idempotency-key': 'k-form' })
  t.equal(otherField.status, 422)
  t.same(otherField.json, reused)
  const otherImage = await create(engine, form('Blue chips', jpeg), { 'idempotency-key': 'k-form' })
  t.equal(otherImage.status, 422, 'other image bytes are another form')
  t.same(otherImage.json, reused)
  const noImage = await create(engine, REQUIRED, { 'idempotency-key': 'k-form' })
  t.equal(noImage.status, 422, 'and so is a form without the image')
  // Parts in another order, a new boundary: the same form.
  const reordered = await create(engine, [form('Blue chips', png)[2]!, ...REQUIRED], { 'idempotency-key': 'k-form' })
  t.equal(reordered.status, 200)
  t.same(reordered.json, first.json)
  t.equal(engine.engine.portfolios.size, 1)
  t.same(readdirSync(engine.imageDir), [`${portfolioIdOf(first)}.png`], 'the refused uploads left no file')

  // Two creates without an image and with one key agree on the digest of no bytes.
  const bare = await create(engine, REQUIRED, { 'idempotency-key': 'k-bare' })
  const bareAgain = await create(engine, [...REQUIRED].reverse(), { 'idempotency-key': 'k-bare' })
  t.same(bareAgain.json, bare.json)
})

t.test('idempotency-key: the record expires after its lifetime, then the key creates again', async (t) => {
  const engine = await startEngine(t, { idempotencyTtlMs: 200 })
  const first = await create(engine, REQUIRED, { 'idempotency-key': 'k-ttl' })
  const again = await create(engine, REQUIRED, { 'idempotency-key': 'k-ttl' })
  t.same(again.json, first.json, 'within its lifetime the key answers its portfolio')
  const other = await create(engine, [{ name: 'name', value: 'Else' }, { name: 'type', value: 'PORTFOLIO' }], { 'idempotency-key': 'k-ttl' })
  t.equal(other.status, 422)
  const store = engine.engine.portfolios
  await attemptUntil(async () => await store.createdWithKey(USER, 'k-ttl'), (r) => r === undefined, 10_000)
  t.equal(await store.createdWithKey(USER, 'k-ttl'), undefined, 'gone once its lifetime has passed')
  const later = await create(engine, [{ name: 'name', value: 'Else' }, { name: 'type', value: 'PORTFOLIO' }], { 'idempotency-key': 'k-ttl' })
  t.equal(later.status, 200, 'the key is free again: a new form creates')
  t.not(portfolioIdOf(later), portfolioIdOf(first))
  t.equal(store.size, 2)
})
