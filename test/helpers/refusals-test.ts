/** The write-first refusal tests (test/routes/create/early-answers-refusals-<kind>.test.ts, one file a kind). */
import type { Test } from 'tap'
import { build } from './app.js'
import { readItsAnswer, refusalsOf, runRefusal, type RefusalKind, type Run, type StartGateway } from './refusals.js'
import { describe, viaPython, viaRawSocket } from './write-first.js'

/** The tests' gateway: build() in this process, closed as soon as its refusal has been tried. */
export const startInProcess = (t: Test): StartGateway => async (upstreamUrl, setup) => {
  const { env, uploadStallTimeoutMs } = setup
  const { close, url } = await build(t, {
    upstreamUrl,
    ...(env === undefined ? {} : { env }),
    ...(uploadStallTimeoutMs === undefined ? {} : { uploadStallTimeoutMs })
  })
  return { url, close }
}

/**
 * Refusals run this many at a time (each with its own gateway and engine double): the 2 s bound holds on a
 * busy 2-core runner only one by one.
 */
const AT_ONCE = 1

/**
 * How soon the answer must be read. On an idle machine every exchange takes
 * well under 2 s (bench/refusals.ts); on a 2-core runner at load 25 a raw
 * socket sharing this process with the gateway took up to 3 s. The bound stays
 * under the linger's stall cut (the uploads' 10 s), so an answer read only
 * because the gateway gave up on the body (the failure this guards against)
 * cannot pass.
 */
export const ANSWERED_WITHIN_MS = 4_000

/**
 * Each refusal of `kind` from python's http.client and a raw socket, small form and
 * 9 MiB: each client reads its exact answer, long before the linger's bounds.
 */
export function writeFirstClientsReadEveryRefusal (t: Test, kind: RefusalKind): void {
  const refusals = refusalsOf(kind)
  t.test(`python http.client and a raw socket, writing the whole body first, read every ${kind} refusal at once`, async (t) => {
    t.ok(refusals.length > 0, `refusals of kind ${kind}: ${refusals.map((r) => r.name).join(', ')}`)
    const runs: Run[] = []
    for (let at = 0; at < refusals.length; at += AT_ONCE) {
      const batch = await Promise.all(refusals.slice(at, at + AT_ONCE).map(async (refusal) => await runRefusal(startInProcess(t), refusal, { 'python http.client': viaPython, 'raw socket': viaRawSocket }, ['small', '9 MiB'])))
      runs.push(...batch.flat())
    }
    for (const run of runs) {
      const what = `${run.refusal}, ${run.client}, ${run.size}`
      t.ok(readItsAnswer(run), `${what}: ${describe(run.outcome)}`)
      t.ok(run.outcome.ms < ANSWERED_WITHIN_MS, `${what}: answered in ${run.outcome.ms} ms`)
    }
  })
}
