/**
 * DECISIONS 21 with the clients people use most besides write-first ones:
 * undici's fetch and curl (which asks `Expect: 100-continue` for a 9 MiB
 * body) read their exact answer for a representative set of refusals: a bad
 * field, uploads busy, an engine that answers mid-upload.
 */
import t from 'tap'
import { REFUSALS, readItsAnswer, runRefusal, type Run } from '../../helpers/refusals.js'
import { ANSWERED_WITHIN_MS, startInProcess } from '../../helpers/refusals-test.js'
import { describe, viaCurl, viaFetch } from '../../helpers/write-first.js'

const SUBSET = ['bad field before the image', '503 uploads busy', 'engine answers mid-upload']

t.test('undici fetch and curl read each refusal of a 9 MiB form at once', async (t) => {
  const runs: Run[] = []
  for (const refusal of REFUSALS.filter((r) => SUBSET.includes(r.name))) {
    runs.push(...await runRefusal(startInProcess(t), refusal, { 'undici fetch': viaFetch, curl: viaCurl }, ['9 MiB']))
  }
  t.equal(runs.length, SUBSET.length * 2)
  for (const run of runs) {
    const what = `${run.refusal}, ${run.client}, ${run.size}`
    t.ok(readItsAnswer(run), `${what}: ${describe(run.outcome)}`)
    t.ok(run.outcome.ms < ANSWERED_WITHIN_MS, `${what}: answered in ${run.outcome.ms} ms`)
  }
})
