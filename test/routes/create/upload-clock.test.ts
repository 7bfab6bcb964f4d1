/**
 * The clock of a streamed upload (src/routes/create/upload-clock.ts) once the
 * engine call is over: given up (a refusal, an engine reset, a client gone)
 * or finished, it holds no timer, and a chunk the form still hands over
 * afterwards arms none. A timer left armed held the request's objects, and a
 * closing process, for the whole stall limit (30 s by default).
 */
import t from 'tap'
import { GatewayError } from '../../../src/http/errors.js'
import { UploadClock } from '../../../src/routes/create/upload-clock.js'
import { MinRate } from '../../../src/routes/create/min-rate.js'

const timers = (): number => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length

t.test('given up mid-upload: the stall timer is cleared, and a later chunk arms nothing', async (t) => {
  const before = timers()
  const clock = new UploadClock(1_000, 30_000, { watch: new MinRate(), cut: () => {} })
  clock.queued()
  clock.handedOver(1024)
  t.ok(timers() > before, 'the stall timer runs while the engine takes the upload')
  clock.abort(new GatewayError('UPSTREAM_UNAVAILABLE', 'portfolio engine unavailable'))
  t.equal(timers(), before, 'none left once the call is given up')
  clock.handedOver(1024)
  clock.bodySent()
  t.equal(timers(), before, 'a chunk handed over after that arms none')
  t.equal((clock.signal.reason as GatewayError).code, 'UPSTREAM_UNAVAILABLE', 'the first reason stays')
})

t.test('stopped when the call settled: a chunk still handed over arms nothing', async (t) => {
  const before = timers()
  const clock = new UploadClock(1_000, 30_000, { watch: new MinRate(), cut: () => {} })
  clock.queued()
  clock.handedOver(1024)
  clock.stop()
  t.equal(timers(), before, 'none left once stopped')
  clock.handedOver(1024)
  t.equal(timers(), before, 'a chunk handed over after that arms none')
  t.equal(clock.signal.aborted, false, 'and nothing aborts the call later')
})
