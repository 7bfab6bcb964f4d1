/** The write-first refusal tests, one subtest per refusal (test/early-answers-refusals*.test.ts). */
import type { Test } from 'tap'
import { build } from './app.js'
import { readItsAnswer, runRefusal, type Refusal, type StartGateway } from './refusals.js'
import { describe, viaPython, viaRawSocket } from './write-first.js'

/** The tests' gateway: build() in this process, closed when the test ends. */
export const startInProcess = (t: Test): StartGateway => async (upstreamUrl, setup) => {
  const { url } = await build(t, { upstreamUrl, ...(setup.env === undefined ? {} : { env: setup.env }), ...(setup.uploadStallTimeoutMs === undefined ? {} : { uploadStallTimeoutMs: setup.uploadStallTimeoutMs }) })
  return { url, close: async () => {} }
}

export function writeFirstClientsReadEveryRefusal (t: Test, refusals: readonly Refusal[]): void {
  for (const refusal of refusals) {
    t.test(`${refusal.name}: a write-first client reads its ${refusal.status}, small form and 9 MiB`, async (t) => {
      const runs = await runRefusal(startInProcess(t), refusal, { 'python http.client': viaPython, 'raw socket': viaRawSocket }, ['small', '9 MiB'])
      for (const run of runs) {
        t.ok(readItsAnswer(run), `${run.client}, ${run.size}: ${describe(run.outcome)}`)
        t.ok(run.outcome.ms < 2000, `${run.client}, ${run.size}: answered in ${run.outcome.ms} ms`)
      }
    })
  }
}
