/**
 * An engine that answers a keyed create before the whole form is in: the
 * gateway still reads the rest of the form (the Idempotency-Key fingerprint
 * covers it all, DECISIONS 16) and holds the client to the minimum rate
 * (DECISIONS 23) while it does. A client that stalls there gets its 408 and
 * the connection closes, instead of no answer until the socket's idle timeout.
 */
import t from 'tap'
import { startStubUpstream } from '../fixtures/stub-upstream.js'
import { build } from './helpers/app.js'
import { slowCreate } from './helpers/slow-upload.js'

const RULE = { stallMs: 500, windowMs: 60_000, bytesPerS: 1, tickMs: 100 }

t.test('the engine answered a keyed create mid-upload, then the client stalled: 408 within the stall limit', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  // The engine answers as the request arrives, before reading the image.
  stub.early = (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ portfolio_id: 'p-early' }))
  }
  const { url } = await build(t, { upstreamUrl: stub.url, uploadMinRate: RULE })
  const slow = slowCreate(url, 'stalls-after-answer', { kind: 'hold' }, 1024 * 1024, { 'idempotency-key': 'early-then-stall-1' })
  t.teardown(() => { slow.finish() })
  const started = performance.now()
  const bound = new Promise<'none'>((resolve) => { const timer = setTimeout(() => resolve('none'), 10_000); timer.unref() })
  const answer = await Promise.race([slow.answer, bound])
  if (answer === 'none') return t.fail('no answer within 10 s of a stall limit of 0.5 s')
  t.equal(answer.status, 408)
  t.same(JSON.parse(answer.text), { error: 'upload stalled: no byte for 0.5 s' })
  t.equal(answer.headers.connection, 'close')
  const took = performance.now() - started
  t.ok(took < 5_000, `answered after ${took.toFixed(0)} ms (stall limit 500 ms)`)
})
