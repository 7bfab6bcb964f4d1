/**
 * DECISIONS 32 at real mobile speeds: python3's http.client writes its whole
 * body in 16 KiB writes paced to the link's rate, then reads. Each refusal is
 * read to its end, with no broken pipe or reset, however long the body takes
 * at that rate (9 MiB at 200 KiB/s takes 46 s: past any fixed linger time), and
 * a valid create at 64 KiB/s gets its 200. The gateway keeps the decided
 * minimum rate (4 KiB/s). The stall limit and the byte bound, with short knobs:
 * early-answers.test.ts.
 */
import t from 'tap'
import { startStubUpstream } from '../../fixtures/stub-upstream.js'
import { build, hs256 } from '../helpers/app.js'
import { CREATE_FIELDS, createValidationError, imagePart, multipartBody, pngOfSize } from '../helpers/multipart.js'
import { describe, viaPython, type ClientRequest } from '../helpers/write-first.js'

// The clients send at phone speed by design: the longest, 12 MiB at 200 KiB/s, takes about 61 s.
t.setTimeout(150_000)

const KiB = 1024
const MiB = 1024 * KiB
const FAST = 200 * KiB
const SLOW = 64 * KiB
/** The 401 of a bad token. */
const NO = { error: 'invalid token' }
const BAD_NAME = [{ name: 'name', value: 'x'.repeat(40) }, { name: 'type', value: 'PORTFOLIO' }]

function create (size: number, token: string, parts = [...CREATE_FIELDS, imagePart(pngOfSize(size))]): ClientRequest {
  const form = multipartBody(parts)
  const headers = { authorization: `Bearer ${token}`, 'content-type': form.contentType }
  return { path: '/api/portfolio/create', headers, body: form.body }
}

t.test('write-first clients on slow links read every refusal, and a valid create gets its 200', async (t) => {
  const engine = await startStubUpstream()
  const { url } = await build(t, { upstreamUrl: engine.url })
  t.teardown(async () => { await engine.close() })
  const twelve = create(12 * MiB, hs256({ sub: 'big' }))
  const cases: Array<{ what: string, req: ClientRequest, status: number, body: unknown }> = [
    { what: '9 MiB, bad token, 200 KiB/s', req: { ...create(9 * MiB, 'bad'), rate: FAST }, status: 401, body: NO },
    {
      what: '9 MiB, bad field, 200 KiB/s',
      req: { ...create(9 * MiB, hs256({ sub: 'field' }), [...BAD_NAME, imagePart(pngOfSize(9 * MiB))]), rate: FAST },
      status: 400,
      body: createValidationError('name must be at most 30 characters')
    },
    {
      what: '12 MiB declared, 200 KiB/s',
      req: { ...twelve, rate: 200 * KiB },
      status: 400,
      body: createValidationError(`body must be at most ${10 * MiB + 64 * KiB} bytes`)
    },
    { what: '2 MiB, bad token, 64 KiB/s', req: { ...create(2 * MiB, 'bad'), rate: SLOW }, status: 401, body: NO },
    {
      what: 'valid 4 MiB, 64 KiB/s',
      req: { ...create(4 * MiB, hs256({ sub: 'valid' })), rate: 64 * KiB },
      status: 200,
      body: { portfolio_id: 'p-stub-1' }
    }
  ]
  const outcomes = await Promise.all(cases.map(async ({ req }) => await viaPython(url, req)))
  cases.forEach(({ what, req, status, body }, i) => {
    const outcome = outcomes[i]!
    t.equal(outcome.error, undefined, `${what}: no broken pipe or reset (${describe(outcome)})`)
    t.equal(outcome.status, status, `${what}: ${status}`)
    t.same(JSON.parse(outcome.body ?? 'null'), body, `${what}: the exact body`)
    // The answer is read once the whole body is written: the client kept its pace to the end.
    const bodyMs = req.body.length / req.rate! * 1000
    t.ok(outcome.ms >= bodyMs * 0.95, `${what}: read after the body, ${outcome.ms} ms (${Math.round(bodyMs)} to send)`)
  })
})
