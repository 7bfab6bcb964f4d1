/**
 * A dead collector (DECISIONS 29): requests unaffected, the queue bounded,
 * the dropped spans counted (test/helpers/tracing-failure.ts); and the
 * shutdown bound with a collector that never answers.
 */
import t from 'tap'
import { collectorFailure } from '../helpers/tracing-failure.js'
import { tracingFrom } from '../helpers/tracing.js'
import { startOtlpSink } from '../../bench/otlp-sink.js'

t.test('the collector is down: requests unaffected, the queue bounded, the dropped spans counted', async (t) => {
  await collectorFailure(t, 'down')
})

t.test('shutdown with a hanging collector returns within its bound', async (t) => {
  const sink = await startOtlpSink({ mode: 'hang' })
  t.teardown(async () => { await sink.close() })
  const tracing = tracingFrom(t, { OTEL_EXPORTER_OTLP_ENDPOINT: sink.url, OTEL_TRACES_SAMPLER: 'always_on' }, 'portfolio-gateway', { exportDelayMs: 60_000 })
  for (let i = 0; i < 10; i++) tracing.tracer.startSpan('queued').end()
  t.equal(tracing.pending, 10)
  const started = performance.now()
  await tracing.shutdown(300)
  const took = performance.now() - started
  t.ok(took < 1_000, `shutdown took ${took.toFixed(0)} ms (bound 300 ms)`)
})
