/**
 * A collector that accepts connections and never answers (DECISIONS 29):
 * requests unaffected, the queue bounded, the dropped spans counted
 * (test/helpers/tracing-failure.ts).
 */
import t from 'tap'
import { collectorFailure } from '../helpers/tracing-failure.js'

t.test('the collector hangs: requests unaffected, the queue bounded, the dropped spans counted', async (t) => {
  await collectorFailure(t, 'hanging')
})
