/**
 * A create the client abandons mid-upload: the gateway aborts its engine
 * request, and the reference engine still exports its server span, marked
 * error.type=client_aborted, under the gateway's try span; the gateway's own
 * server span ends the same way.
 */
import { once } from 'node:events'
import { connect } from 'node:net'
import t from 'tap'
import { startOtlpSink } from '../../bench/otlp-sink.js'
import { waitUntil } from '../../deploy/local/parts.js'
import { faults, startStubUpstream } from '../../fixtures/stub-upstream.js'
import { bearer, build } from '../helpers/app.js'
import { startEngine } from '../helpers/engine.js'
import { CREATE_FIELDS, imagePart, multipartBody, pngOfSize } from '../helpers/multipart.js'
import { CLIENT, SERVER, tracingFrom } from '../helpers/tracing.js'

t.test('an upload cut off mid-body: the engine\'s span ends with error.type client_aborted, under the try span', async (t) => {
  const sink = await startOtlpSink()
  t.teardown(async () => { await sink.close() })
  const otel = { OTEL_EXPORTER_OTLP_ENDPOINT: sink.url, OTEL_TRACES_SAMPLER: 'always_on' }
  const engine = await startEngine(t, { tracer: tracingFrom(t, otel, 'portfolio-engine').tracer })
  const gateway = await build(t, { upstreamUrl: engine.origin, env: otel, tracing: tracingFrom(t, otel, 'portfolio-gateway') })

  const { body, contentType } = multipartBody([...CREATE_FIELDS, imagePart(pngOfSize(2 * 1024 * 1024))])
  const { port } = new URL(gateway.url)
  const socket = connect(Number(port), '127.0.0.1')
  socket.on('error', () => {})
  await once(socket, 'connect')
  const engineGotIt = once(engine.engine.server, 'request')
  const head = Object.entries({ host: 'x', ...bearer(), 'content-type': contentType, 'content-length': String(body.length) }).map(([k, v]) => `${k}: ${v}\r\n`).join('')
  socket.write(`POST /api/portfolio/create HTTP/1.1\r\n${head}\r\n`)
  // A quarter of the body: the fields and the start of the image, so the gateway has begun its engine request.
  socket.write(body.subarray(0, body.length / 4))
  await engineGotIt
  socket.resetAndDestroy()

  const spans = await sink.until((all) => all.some((s) => s.service === 'portfolio-engine' && s.kind === SERVER))
  const engineSpan = spans.find((s) => s.service === 'portfolio-engine' && s.kind === SERVER)!
  t.equal(engineSpan.attributes['error.type'], 'client_aborted')
  t.equal(engineSpan.attributes['http.route'], '/api/portfolio/create')
  const all = await sink.until((s) => s.some((x) => x.spanId === engineSpan.parentSpanId))
  const parent = all.find((s) => s.spanId === engineSpan.parentSpanId)!
  t.match(parent, { service: 'portfolio-gateway', kind: CLIENT, name: 'POST /api/portfolio/create', traceId: engineSpan.traceId })
  // The gateway's own server span ends too, and says the client went away.
  const withServer = await sink.until((s) => s.some((x) => x.service === 'portfolio-gateway' && x.kind === SERVER && x.traceId === engineSpan.traceId))
  const server = withServer.find((x) => x.service === 'portfolio-gateway' && x.kind === SERVER && x.traceId === engineSpan.traceId)!
  t.match(server, { name: 'POST /api/portfolio/create', attributes: { 'error.type': 'client_aborted', 'http.route': '/api/portfolio/create' } }, 'the gateway\'s server span: client_aborted')
  t.equal(parent.parentSpanId, server.spanId, 'the try under it')
})

t.test('a client gone after sending its whole form, while the engine has not answered: the gateway\'s server span still ends client_aborted', async (t) => {
  const sink = await startOtlpSink()
  t.teardown(async () => { await sink.close() })
  const otel = { OTEL_EXPORTER_OTLP_ENDPOINT: sink.url, OTEL_TRACES_SAMPLER: 'always_on' }
  const engine = await startStubUpstream(faults.hang)
  // A long engine deadline: only the client's going can end the span before the engine answers.
  const gateway = await build(t, { upstreamUrl: engine.url, env: { ...otel, UPSTREAM_TIMEOUT_MS: '30000' }, tracing: tracingFrom(t, otel, 'portfolio-gateway') })
  // Registered after the gateway, so it runs first (teardowns run last in, first out): the engine's
  // connections close, the hanging create ends with a 502, and the gateway's close need not wait
  // out the 30 s deadline for it.
  t.teardown(engine.close)
  const { body, contentType } = multipartBody([...CREATE_FIELDS, imagePart(pngOfSize(4096))])
  const socket = connect(Number(new URL(gateway.url).port), '127.0.0.1')
  socket.on('error', () => {})
  await once(socket, 'connect')
  const head = Object.entries({ host: 'x', ...bearer(), 'content-type': contentType, 'content-length': String(body.length) }).map(([k, v]) => `${k}: ${v}\r\n`).join('')
  socket.write(`POST /api/portfolio/create HTTP/1.1\r\n${head}\r\n`)
  socket.write(body)
  // The engine has the whole form (the stub records a request once its body ended) and never answers.
  await waitUntil('the engine holding the whole form', async () => engine.requests.length === 1, 10_000)
  socket.resetAndDestroy()
  const spans = await sink.until((all) => all.some((s) => s.service === 'portfolio-gateway' && s.kind === SERVER))
  t.match(spans.find((s) => s.service === 'portfolio-gateway' && s.kind === SERVER), { name: 'POST /api/portfolio/create', attributes: { 'error.type': 'client_aborted' } })
})
