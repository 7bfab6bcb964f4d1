/**
 * A client span per engine try (DECISIONS 29), through the engine client's
 * per-try observer (EngineClient.observeTries): each try a child of the
 * server span, carrying its endpoint, attempt, retry reason and outcome, and
 * propagating its own context so the engine's span nests under the try.
 */
import t from 'tap'
import { request } from 'undici'
import { bearer, hs256, MINTS } from '../helpers/app.js'
import { multipartBody, CREATE_FIELDS, imagePart, pngOfSize } from '../helpers/multipart.js'
import { clientTraceparent, CLIENT, notBefore, ofTrace, SERVER, tracedPair } from '../helpers/tracing.js'
import type { DecodedSpan } from '../../bench/otlp-sink.js'

const TOKEN = hs256({ sub: 'subject-of-the-tries' })

function treeOf (spans: DecodedSpan[], traceId: string) {
  const mine = ofTrace(spans, traceId)
  const server = mine.find((s) => s.service === 'portfolio-gateway' && s.kind === SERVER)
  const tries = mine
    .filter((s) => s.service === 'portfolio-gateway' && s.kind === CLIENT && !s.name.startsWith('idempotency '))
    .sort((a, b) => Number(a.attributes['portfolio.engine.attempt']) - Number(b.attributes['portfolio.engine.attempt']))
  const engine = mine.filter((s) => s.service === 'portfolio-engine')
  return { server, tries, engine }
}

t.test('the engine client reports its tries to an observer', async (t) => {
  const { gateway } = await tracedPair(t)
  t.type(
    (gateway.engine as unknown as { observeTries?: unknown }).observeTries,
    'function',
    'EngineClient.observeTries exists'
  )
})

t.test(
  'a ping, an update and a create: one try each, a child of the server span, the engine under the try',
  async (t) => {
    const { sink, gateway, engineOrigin } = await tracedPair(t, {}, { env: { TRUST_PROXY: '127.0.0.1' } })
    const port = Number(new URL(engineOrigin).port)
    const headers = bearer(TOKEN)
    const ping = clientTraceparent()
    const res = await request(`${gateway.url}/api/portfolio/ping`, {
      headers: { ...headers, traceparent: ping.header }
    })
    t.equal(res.statusCode, 200)
    await res.body.dump()
    const create = clientTraceparent()
    const form = multipartBody([...CREATE_FIELDS, imagePart(pngOfSize(2048))])
    const created = await request(`${gateway.url}/api/portfolio/create`, {
      method: 'POST',
      headers: { ...headers, traceparent: create.header, 'content-type': form.contentType },
      body: form.body
    })
    t.equal(created.statusCode, 200)
    const { portfolio_id: id } = (await created.body.json()) as { portfolio_id: string }
    const update = clientTraceparent()
    const updated = await request(`${gateway.url}/api/portfolio/update`, {
      method: 'POST',
      headers: { ...headers, traceparent: update.header, 'content-type': 'application/json' },
      body: JSON.stringify({ portfolio_id: id, target_positions: [{ mint: MINTS[1], allocation: 1 }] })
    })
    t.equal(updated.statusCode, 200)
    await updated.body.dump()

    const cases = [
      [ping, 'GET', '/api/portfolio/ping', 'ping'],
      [create, 'POST', '/api/portfolio/create', 'create'],
      [update, 'POST', '/api/portfolio/update', 'update']
    ] as const
    const spans = await sink.until((all) =>
      cases.every(([trace]) => {
        const tree = treeOf(all, trace.traceId)
        return tree.server !== undefined && tree.tries.length === 1 && tree.engine.length === 1
      })
    )
    for (const [trace, method, path, call] of cases) {
      const { server, tries, engine } = treeOf(spans, trace.traceId)
      t.equal(tries[0]!.parentSpanId, server!.spanId, `${call}: the try is a child of the server span`)
      t.match(tries[0], { name: `${method} ${path}`, kind: CLIENT })
      t.same(
        tries[0]!.attributes,
        {
          'http.request.method': method,
          'url.path': path,
          'server.address': '127.0.0.1',
          'server.port': port,
          'portfolio.engine.call': call,
          'portfolio.engine.attempt': 1,
          'portfolio.engine.outcome': 'ok',
          'http.response.status_code': 200
        },
        `${call}: the try's attributes`
      )
      t.equal(engine[0]!.parentSpanId, tries[0]!.spanId, `${call}: the engine's span nests under the try`)
    }
  }
)

t.test(
  'a ping retried on a second engine: two client spans, the second with its reason, the engine under the second',
  async (t) => {
    // The first endpoint refuses connections (nothing listens on 127.0.0.2 at the engine's port); the balancer picks it
    // first.
    const { sink, gateway, engineOrigin } = await tracedPair(
      t,
      {},
      { env: { TRUST_PROXY: '127.0.0.1' }, cluster: { health: { intervalMs: 0 }, random: () => 0 } },
      (origin) => [origin.replace('127.0.0.1', '127.0.0.2'), origin]
    )
    const port = Number(new URL(engineOrigin).port)
    const trace = clientTraceparent()
    const res = await request(`${gateway.url}/api/portfolio/ping`, {
      headers: { ...bearer(TOKEN), traceparent: trace.header }
    })
    t.equal(res.statusCode, 200)
    await res.body.dump()
    const spans = await sink.until((all) => {
      const tree = treeOf(all, trace.traceId)
      return tree.server !== undefined && tree.tries.length === 2 && tree.engine.length === 1
    })
    const { server, tries, engine } = treeOf(spans, trace.traceId)
    t.match(tries[0], {
      parentSpanId: server!.spanId,
      statusCode: 2,
      attributes: {
        'server.address': '127.0.0.2',
        'server.port': port,
        'portfolio.engine.attempt': 1,
        'portfolio.engine.outcome': 'unavailable',
        'error.type': 'unavailable'
      }
    })
    t.notOk('portfolio.engine.retry_reason' in tries[0]!.attributes, 'a first try is no retry')
    t.match(tries[1], {
      parentSpanId: server!.spanId,
      attributes: {
        'server.address': '127.0.0.1',
        'server.port': port,
        'portfolio.engine.attempt': 2,
        'http.request.resend_count': 1,
        'portfolio.engine.retry_reason': 'unreachable',
        'portfolio.engine.outcome': 'ok',
        'http.response.status_code': 200
      }
    })
    t.ok(notBefore(tries[1]!.startNs, tries[0]!.endNs), 'the retry follows the first try')
    t.equal(engine[0]!.parentSpanId, tries[1]!.spanId, "the engine's span nests under the try that reached it")
  }
)
