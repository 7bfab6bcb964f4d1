/**
 * The minimum-rate rule of fair uploads (DECISIONS 23) lets a slow but steady
 * phone through: 200 KB at 6 KiB/s, over the production rule's 30 s window,
 * over real sockets against a stub engine. On its own: it takes 33 s by design.
 */
import t, { type Test } from 'tap'
import { startStubUpstream } from '../../../fixtures/stub-upstream.js'
import { build } from '../../helpers/app.js'
import { slowCreate, type SlowCreate } from '../../helpers/slow-upload.js'

/** Stops every slow create a test opened, so no socket outlives it. */
function opened (t: Test): SlowCreate[] {
  const list: SlowCreate[] = []
  t.teardown(() => { for (const c of list) c.stop() })
  return list
}

t.test('a steady 6 KiB/s phone uploading 200 KB gets through (production minimum rate)', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const creates = opened(t)
  const phone = slowCreate(url, 'phone', { kind: 'steady', bytesPerS: 6 * 1024, everyMs: 250 }, 200_000)
  creates.push(phone)
  const begun = performance.now()
  const answer = await phone.answer
  const took = (performance.now() - begun) / 1000
  t.equal(answer.status, 200, `answered after ${took.toFixed(1)} s`)
  t.same(JSON.parse(answer.text), { portfolio_id: 'p-stub-1' })
  t.ok(took > 30, 'the upload really took longer than the 30 s window')
  t.equal(stub.requests.length, 1)
})
