/**
 * A create's exchange through real sockets: for each way a create can go (streamed, invited with
 * `100 Continue`, keyed, refused mid-form, a small form with no image), the client gets its answer, the
 * exchange ends for the reason the route says, and no event ever arrives out of the table's order.
 */
import { Writable } from 'node:stream'
import t from 'tap'
import { request } from 'undici'
import { startStubUpstream } from '../../../fixtures/stub-upstream.js'
import { bearer, build, hs256 } from '../../helpers/app.js'
import { CREATE_FIELDS, imagePart, multipartBody, pngOfSize } from '../../helpers/multipart.js'
import { rawSocket } from '../../helpers/write-first.js'

interface Line { level: number, msg: string, endReason?: string }

function capture (): { stream: Writable, lines: Line[] } {
  const lines: Line[] = []
  const stream = new Writable({
    write (chunk: Buffer, _encoding, done) {
      for (const text of chunk.toString().split('\n')) if (text !== '') lines.push(JSON.parse(text) as Line)
      done()
    }
  })
  return { stream, lines }
}

const IMAGE = multipartBody([...CREATE_FIELDS, imagePart(pngOfSize(256 * 1024))])
const NOT_AN_IMAGE = multipartBody([...CREATE_FIELDS, imagePart(Buffer.from('plain text, not an image'))])
const NO_IMAGE = multipartBody(CREATE_FIELDS)

t.test('every kind of create ends for its reason, with no event out of order', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { stream, lines } = capture()
  const { url } = await build(t, { upstreamUrl: stub.url, logger: { level: 'debug', stream } })
  const post = async (form: { body: Buffer, contentType: string }, headers: Record<string, string> = {}) => {
    const res = await request(`${url}/api/portfolio/create`, {
      method: 'POST', headers: { ...bearer(hs256()), 'content-type': form.contentType, ...headers }, body: form.body
    })
    await res.body.dump()
    return res.statusCode
  }
  t.equal(await post(IMAGE), 200, 'streamed')
  t.equal(await post(IMAGE, { 'idempotency-key': 'exchange-keyed' }), 200, 'keyed')
  t.equal(await post(IMAGE, { 'idempotency-key': 'exchange-keyed' }), 200, 'replayed')
  t.equal(await post(NOT_AN_IMAGE), 400, 'refused once the image is sniffed')
  t.equal(await post(NO_IMAGE), 200, 'a small form without an image goes to the engine whole')
  const invited = await rawSocket(url, {
    path: '/api/portfolio/create',
    headers: { ...bearer(hs256()), 'content-type': IMAGE.contentType },
    body: IMAGE.body
  }, { expectContinue: true })
  t.equal(invited.continued, true, 'invited')
  t.equal(invited.status, 200)
  const ended = lines.filter((l) => l.msg === 'create exchange ended').map((l) => l.endReason)
  t.same(ended, ['answered', 'answered', 'answered', 'refused', 'answered', 'answered'])
  t.same(lines.filter((l) => l.level >= 50), [], 'no error logged: every event had its row')
})
