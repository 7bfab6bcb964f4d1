/**
 * The exchange's timers once the engine call is over: given up (a refusal, an engine reset, a client gone)
 * or finished, a create holds no timer, and a chunk the form still hands over afterwards arms none. A timer
 * left armed held the request's objects, and a closing process, for the whole stall limit (30 s by default).
 */
import t from 'tap'
import { Writable } from 'node:stream'
import type { ServerResponse } from 'node:http'
import { GatewayError } from '../../../src/http/errors.js'
import { UploadShare } from '../../../src/limits/upload-share.js'
import { CreateExchange } from '../../../src/routes/create/exchange.js'
import { MinRate } from '../../../src/routes/create/min-rate.js'

const timers = (): number => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length

/** A create streaming its image: the engine clock runs, and a first chunk has gone to the engine. */
async function streaming (): Promise<CreateExchange> {
  const response = new Writable({ write: (_chunk, _encoding, done) => { done() } })
  const exchange = new CreateExchange({
    subject: 'alice',
    share: new UploadShare({ maxPerUser: 1, maxConnections: 1, endpoints: () => 1 }),
    minRate: new MinRate(),
    responseTimeoutMs: 1_000,
    stallTimeoutMs: 30_000,
    response: response as unknown as ServerResponse,
    cut: () => {},
    invite: () => {},
    received: () => 0
  })
  await exchange.claim()
  exchange.sniff()
  await exchange.stream()
  return exchange
}

t.test('given up mid-upload: the stall timer is cleared, and a later chunk arms nothing', async (t) => {
  const before = timers()
  const exchange = await streaming()
  exchange.handedOver(1024)
  t.ok(timers() > before, 'the stall timer runs while the engine takes the upload')
  exchange.abort(new GatewayError('UPSTREAM_UNAVAILABLE', 'portfolio engine unavailable'))
  t.equal(timers(), before, 'none left once the call is given up')
  exchange.handedOver(1024)
  exchange.bodySent()
  t.equal(timers(), before, 'a chunk handed over after that arms none')
  t.equal((exchange.signal.reason as GatewayError).code, 'UPSTREAM_UNAVAILABLE', 'the first reason stays')
  exchange.dispose()
})

t.test('a refusal the form reports mid-upload gives the call up the same way', async (t) => {
  const before = timers()
  const exchange = await streaming()
  exchange.handedOver(1024)
  exchange.refused(new GatewayError('VALIDATION_ERROR', 'image must be PNG or JPEG'))
  t.equal(timers(), before, 'none left once refused')
  t.equal((exchange.signal.reason as GatewayError).code, 'VALIDATION_ERROR')
  exchange.dispose()
})

t.test('stopped when the call settled: a chunk still handed over arms nothing', async (t) => {
  const before = timers()
  const exchange = await streaming()
  exchange.handedOver(1024)
  exchange.callOver()
  exchange.dispose()
  t.equal(timers(), before, 'none left once stopped')
  exchange.handedOver(1024)
  exchange.taken()
  t.equal(timers(), before, 'a chunk handed over after that arms none')
  t.equal(exchange.signal.aborted, false, 'and nothing aborts the call later')
  t.same(exchange.illegal, [], 'a late chunk is no illegal step')
})

t.test('the engine answered mid-upload: a chunk undici had pulled arms nothing', async (t) => {
  const before = timers()
  const exchange = await streaming()
  exchange.handedOver(1024)
  exchange.responded()
  t.equal(timers(), before, 'the answer stops every timer')
  exchange.taken()
  exchange.handedOver(1024)
  exchange.callOver()
  exchange.handedOver(1024)
  t.equal(timers(), before, 'late chunks arm none')
  t.equal(exchange.state, 'engine-done')
  exchange.dispose()
})

t.test('a chunk taken by the engine disarms the stall timer until the next one', async (t) => {
  const exchange = await streaming()
  exchange.handedOver(1024)
  const armed = timers()
  exchange.taken()
  t.equal(timers(), armed - 1, 'the stall timer is cleared; the minimum rate still ticks')
  exchange.dispose()
})
