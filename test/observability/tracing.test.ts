/**
 * Traces over OTLP (DECISIONS 29), end to end over real sockets: a traced
 * gateway in front of a traced reference engine, both exporting to an
 * OTLP/HTTP receiver this test starts, which decodes the protobuf the real
 * exporter sends. The per-try client spans have their own file
 * (test/observability/tracing-tries.test.ts).
 */
import t from 'tap'
import { request } from 'undici'
import { bearer, hs256, MINTS } from '../helpers/app.js'
import { multipartBody, CREATE_FIELDS, imagePart, pngOfSize } from '../helpers/multipart.js'
import { clientTraceparent, CLIENT, notBefore, ofTrace, SERVER, tracedPair } from '../helpers/tracing.js'
import type { DecodedSpan } from '../../bench/otlp-sink.js'

/** A subject and a token that must never leave in an export. */
const SUBJECT = 'subject-5be1c0de-never-exported'
const TOKEN = hs256({ sub: SUBJECT })

/** The spans of `trace` from `service`, and the gateway's server span of it. */
function find (spans: DecodedSpan[], traceId: string) {
  const mine = ofTrace(spans, traceId)
  const gateway = mine.filter((s) => s.service === 'portfolio-gateway')
  const server = gateway.find((s) => s.kind === SERVER)
  const engine = mine.filter((s) => s.service === 'portfolio-engine' && s.kind === SERVER)
  return { mine, gateway, server, engine }
}

/** The gateway span the engine's span hangs from: the server span itself, or one of its client spans (an engine try).
 *
 */
function engineParentOk (spans: DecodedSpan[], engineSpan: DecodedSpan, server: DecodedSpan): boolean {
  if (engineSpan.parentSpanId === server.spanId) return true
  const parent = spans.find((s) => s.spanId === engineSpan.parentSpanId)
  return (
    parent !== undefined &&
    parent.service === 'portfolio-gateway' &&
    parent.kind === CLIENT &&
    parent.parentSpanId === server.spanId
  )
}

t.test(
  "a ping, a keyed update and a create with an image: each a server span continuing the client's trace, the engine's spans under the gateway's, nothing secret exported",
  async (t) => {
    // The default sampler (parentbased_traceidratio at 0.01) follows the client's sampled flag.
    const { sink, gateway } = await tracedPair(t, {}, { env: { TRUST_PROXY: '127.0.0.1' } })
    const headers = bearer(TOKEN)

    const pingTrace = clientTraceparent()
    const ping = await request(`${gateway.url}/api/portfolio/ping`, {
      headers: { ...headers, traceparent: pingTrace.header }
    })
    t.equal(ping.statusCode, 200)
    await ping.body.dump()
    const pingId = String(ping.headers['x-request-id'])

    const createTrace = clientTraceparent()
    const form = multipartBody([...CREATE_FIELDS, imagePart(pngOfSize(4096))])
    const created = await request(`${gateway.url}/api/portfolio/create`, {
      method: 'POST',
      headers: { ...headers, traceparent: createTrace.header, 'content-type': form.contentType },
      body: form.body
    })
    t.equal(created.statusCode, 200)
    const { portfolio_id: portfolioId } = (await created.body.json()) as { portfolio_id: string }

    const updateTrace = clientTraceparent()
    const updated = await request(`${gateway.url}/api/portfolio/update`, {
      method: 'POST',
      headers: {
        ...headers,
        traceparent: updateTrace.header,
        'content-type': 'application/json',
        'idempotency-key': 'key-of-the-update-1'
      },
      body: JSON.stringify({ portfolio_id: portfolioId, target_positions: [{ mint: MINTS[0], allocation: 1 }] })
    })
    t.equal(updated.statusCode, 200)
    t.same(await updated.body.json(), { success: true, message: 'Target positions updated' })

    const refusedTrace = clientTraceparent()
    const refused = await request(`${gateway.url}/api/portfolio/update`, {
      method: 'POST',
      headers: { ...headers, traceparent: refusedTrace.header, 'content-type': 'application/json' },
      body: '{}'
    })
    t.equal(refused.statusCode, 400)
    await refused.body.dump()

    const traces = [pingTrace, createTrace, updateTrace]
    const spans = await sink.until(
      (all) =>
        traces.every(({ traceId }) => {
          const f = find(all, traceId)
          return f.server !== undefined && f.engine.length === 1
        }) &&
        find(all, refusedTrace.traceId).server !== undefined &&
        find(all, updateTrace.traceId).gateway.some((s) => s.name === 'idempotency complete')
    )

    t.test('the ping', async (t) => {
      const { server, engine } = find(spans, pingTrace.traceId)
      t.match(
        server,
        { name: 'GET /api/portfolio/ping', kind: SERVER, parentSpanId: pingTrace.parentId, statusCode: 0 },
        "continues the client's span"
      )
      t.same(server!.attributes, {
        'http.request.method': 'GET',
        'http.route': '/api/portfolio/ping',
        'http.response.status_code': 200,
        'http.request.header.x-request-id': [pingId]
      })
      t.match(engine[0], {
        name: 'GET /api/portfolio/ping',
        attributes: {
          'http.request.method': 'GET',
          'http.route': '/api/portfolio/ping',
          'http.response.status_code': 200
        }
      })
      t.ok(engineParentOk(spans, engine[0]!, server!), "the engine's span nests under the gateway's")
    })

    t.test('the create with an image', async (t) => {
      const { server, gateway: own, engine } = find(spans, createTrace.traceId)
      t.match(server, {
        name: 'POST /api/portfolio/create',
        parentSpanId: createTrace.parentId,
        attributes: { 'http.route': '/api/portfolio/create', 'http.response.status_code': 200 }
      })
      const wait = own.find((s) => s.name === 'upload connection wait')
      t.match(
        wait,
        { parentSpanId: server!.spanId, kind: 1 },
        'the wait for an upload connection is a child of the server span'
      )
      t.type(wait!.attributes['portfolio.upload.wait_ms'], 'number')
      t.ok(notBefore(wait!.startNs, server!.startNs) && notBefore(server!.endNs, wait!.endNs), 'within the request')
      t.match(engine[0], { name: 'POST /api/portfolio/create', attributes: { 'http.response.status_code': 200 } })
      t.ok(engineParentOk(spans, engine[0]!, server!))
    })

    t.test("the keyed update: the store's claim and complete", async (t) => {
      const { server, gateway: own, engine } = find(spans, updateTrace.traceId)
      t.match(server, {
        name: 'POST /api/portfolio/update',
        parentSpanId: updateTrace.parentId,
        attributes: { 'http.response.status_code': 200 }
      })
      const store = own.filter((s) => s.name.startsWith('idempotency '))
      t.same(store.map((s) => s.name).sort(), ['idempotency claim', 'idempotency complete'])
      for (const s of store) {
        t.equal(s.parentSpanId, server!.spanId, `${s.name} is a child of the server span`)
        t.same(s.attributes, { 'db.system.name': 'memory', 'db.operation.name': s.name.slice('idempotency '.length) })
      }
      const claim = store.find((s) => s.name === 'idempotency claim')!
      t.ok(notBefore(engine[0]!.startNs, claim.endNs), 'the key is claimed before the engine is asked')
    })

    t.test('a refused request carries its error code', async (t) => {
      const { server, engine } = find(spans, refusedTrace.traceId)
      t.match(server!.attributes, { 'http.response.status_code': 400, 'error.type': 'VALIDATION_ERROR' })
      t.equal(server!.statusCode, 0, "a 4xx is the client's, not a failed span")
      t.same(engine, [], 'never reached the engine')
    })

    t.test('no token, subject or body in the export', async (t) => {
      const bytes = Buffer.concat(sink.bodies)
      t.ok(bytes.length > 0)
      for (const secret of [TOKEN, TOKEN.split('.')[1]!, SUBJECT, 'key-of-the-update-1', 'Blue chips', portfolioId]) {
        t.equal(bytes.indexOf(secret), -1, `${secret.slice(0, 24)}… is not in the export`)
      }
    })
  }
)

t.test("the engine gets the server span's id and sampled flag in traceparent", async (t) => {
  const { sink, gateway } = await tracedPair(t, { OTEL_TRACES_SAMPLER: 'always_on' })
  // No traceparent from the client: the gateway starts the trace, with the id its log lines carry.
  const res = await request(`${gateway.url}/api/portfolio/ping`, { headers: bearer(TOKEN) })
  t.equal(res.statusCode, 200)
  await res.body.dump()
  const spans = await sink.until(
    (all) =>
      all.some((s) => s.service === 'portfolio-engine') &&
      all.some((s) => s.service === 'portfolio-gateway' && s.kind === SERVER)
  )
  const server = spans.find((s) => s.service === 'portfolio-gateway' && s.kind === SERVER)!
  const engine = spans.find((s) => s.service === 'portfolio-engine')!
  t.equal(server.parentSpanId, '', 'a root span')
  t.equal(engine.traceId, server.traceId)
  t.ok(engineParentOk(spans, engine, server), "sampled, under the gateway's span")
})
