/**
 * The standalone engine reads the same OTEL_* variables (DECISIONS 29): its
 * server span continues the caller's traceparent, as service portfolio-engine;
 * a bad variable stops it with one line.
 */
import { spawnSync } from 'node:child_process'
import t from 'tap'
import { request } from 'undici'
import { startOtlpSink } from '../../bench/otlp-sink.js'
import { startEngineProcess } from '../helpers/engine-process.js'
import { ENGINE_SCRIPT, ensureBuilt } from '../helpers/processes.js'
import { clientTraceparent, SERVER } from '../helpers/tracing.js'

t.test('the engine process exports a server span under the caller\'s span', async (t) => {
  ensureBuilt()
  const sink = await startOtlpSink()
  t.teardown(async () => { await sink.close() })
  const engine = await startEngineProcess(t, { OTEL_EXPORTER_OTLP_ENDPOINT: sink.url })
  const caller = clientTraceparent()
  const res = await request(`${engine.url}/api/portfolio/ping`, { headers: { 'x-user-id': 'someone', traceparent: caller.header } })
  t.equal(res.statusCode, 200)
  await res.body.dump()
  // The batch leaves within the export delay (1 s).
  const spans = await sink.until((all) => all.length > 0)
  t.match(spans, [{ service: 'portfolio-engine', kind: SERVER, name: 'GET /api/portfolio/ping', traceId: caller.traceId, parentSpanId: caller.parentId, attributes: { 'http.route': '/api/portfolio/ping', 'http.response.status_code': 200 } }])
})

t.test('a bad OTEL_* variable stops the engine with one line', async (t) => {
  ensureBuilt()
  const run = spawnSync(process.execPath, [ENGINE_SCRIPT], { env: { PATH: process.env.PATH, ENGINE_PORT: '0', OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318', OTEL_TRACES_SAMPLER_ARG: 'half' }, encoding: 'utf8', timeout: 20_000 })
  t.equal(run.status, 1)
  t.equal(run.stderr, 'portfolio-engine: OTEL_TRACES_SAMPLER_ARG is invalid: does not have the expected form; expected the traceidratio samplers\' ratio, a number from 0 to 1, e.g. 0.01 (default)\n')
})
