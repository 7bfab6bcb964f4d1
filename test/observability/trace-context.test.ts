/**
 * W3C Trace Context: the client's trace is continued, or a new one is started;
 * the engine gets the trace id with the gateway's span as parent; every log
 * line of the request carries traceId beside reqId.
 */
import { Writable } from 'node:stream'
import t, { type Test } from 'tap'
import { request } from 'undici'
import { startStubUpstream } from '../../fixtures/stub-upstream.js'
import { formatTraceParent, newSpanId, newTraceId, parseTraceParent } from '../../src/observability/trace-context.js'
import { bearer, build, validUpdate } from '../helpers/app.js'

const TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736'
const PARENT_ID = '00f067aa0ba902b7'
const VALID = `00-${TRACE_ID}-${PARENT_ID}-01`
const WELL_FORMED = /^00-([0-9a-f]{32})-([0-9a-f]{16})-(0[01])$/

t.test('parseTraceParent accepts only what the spec calls valid', async (t) => {
  t.same(parseTraceParent(VALID), { traceId: TRACE_ID, parentId: PARENT_ID, flags: '01' })
  t.same(parseTraceParent(`cc-${TRACE_ID}-${PARENT_ID}-09-what-the-future-adds`), { traceId: TRACE_ID, parentId: PARENT_ID, flags: '09' }, 'a later version: its first four fields')
  t.same(parseTraceParent(`cc-${TRACE_ID}-${PARENT_ID}-09`), { traceId: TRACE_ID, parentId: PARENT_ID, flags: '09' })
  const invalid = [
    undefined,
    [VALID, VALID],
    '',
    VALID.toUpperCase(),
    `00-${'0'.repeat(32)}-${PARENT_ID}-01`,
    `00-${TRACE_ID}-${'0'.repeat(16)}-01`,
    `ff-${TRACE_ID}-${PARENT_ID}-01`,
    `00-${TRACE_ID}-${PARENT_ID}-01-extra`,
    `00-${TRACE_ID}-${PARENT_ID}-1`,
    `00-${TRACE_ID.slice(1)}-${PARENT_ID}-01`,
    `00-${TRACE_ID}-${PARENT_ID}-0g`,
    ` ${VALID}`,
    `cc-${TRACE_ID}-${PARENT_ID}-09extra`,
    `0-${TRACE_ID}-${PARENT_ID}-01`,
    `00-${TRACE_ID}-${PARENT_ID}-01${'0'.repeat(600)}`,
    // Two headers, as Node joins them: a later version's free tail must not swallow the second.
    `cc-${TRACE_ID}-${PARENT_ID}-01-x, 00-${TRACE_ID}-${PARENT_ID}-01`
  ]
  for (const header of invalid) t.equal(parseTraceParent(header), undefined, JSON.stringify(header)?.slice(0, 80) ?? 'undefined')
})

t.test('new ids are random, the right length, and never all zeros', async (t) => {
  const traces = new Set<string>()
  for (let i = 0; i < 200; i++) {
    const traceId = newTraceId()
    const spanId = newSpanId()
    t.match(formatTraceParent(traceId, spanId, '00'), WELL_FORMED)
    t.notMatch(traceId, /^0+$/)
    t.notMatch(spanId, /^0+$/)
    traces.add(traceId)
  }
  t.equal(traces.size, 200, 'no repeats')
})

async function gatewayAndStub (t: Test, env: Record<string, string> = {}) {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url, env })
  return { stub, url }
}

t.test('a valid traceparent from a trusted proxy: the engine gets the same trace id with a new span id, sampled flag kept', async (t) => {
  const { stub, url } = await gatewayAndStub(t, { TRUST_PROXY: '127.0.0.1' })
  const res = await request(`${url}/api/portfolio/update`, {
    method: 'POST',
    headers: { ...bearer(), 'content-type': 'application/json', traceparent: VALID },
    body: JSON.stringify(validUpdate())
  })
  t.equal(res.statusCode, 200)
  await res.body.dump()
  const sent = stub.requests[0]?.headers.traceparent
  const [, traceId, parentId, flags] = WELL_FORMED.exec(String(sent)) ?? []
  t.equal(traceId, TRACE_ID, 'same trace')
  t.not(parentId, PARENT_ID, "the gateway's own span, not the client's")
  t.equal(flags, '01')

  const again = await request(`${url}/api/portfolio/ping`, { headers: { ...bearer(), traceparent: `00-${TRACE_ID}-${PARENT_ID}-03` } })
  await again.body.dump()
  const second = WELL_FORMED.exec(String(stub.requests[1]?.headers.traceparent))
  t.equal(second?.[1], TRACE_ID)
  t.not(second?.[2], parentId, 'every request its own span')
  t.equal(second?.[3], '01', 'flags the gateway does not know are cleared')
})

t.test('a sampled traceparent from anyone else, tracing off: the trace id kept, the flag cleared (the engine follows it; tracing-sampling checks it with tracing on)', async (t) => {
  const { stub, url } = await gatewayAndStub(t, { TRUST_PROXY: '10.0.0.0/8' })
  const res = await request(`${url}/api/portfolio/ping`, { headers: { ...bearer(), traceparent: VALID } })
  t.equal(res.statusCode, 200)
  await res.body.dump()
  const [, traceId, parentId, flags] = WELL_FORMED.exec(String(stub.requests[0]?.headers.traceparent)) ?? []
  t.equal(traceId, TRACE_ID, 'same trace')
  t.not(parentId, PARENT_ID)
  t.equal(flags, '00', 'not sampled: the client is not a trusted proxy')
})

t.test('an invalid or missing traceparent: a fresh valid one', async (t) => {
  const { stub, url } = await gatewayAndStub(t)
  const given = [`00-${'0'.repeat(32)}-${PARENT_ID}-01`, VALID.toUpperCase(), 'garbage', undefined]
  for (const header of given) {
    const res = await request(`${url}/api/portfolio/ping`, { headers: { ...bearer(), ...(header === undefined ? {} : { traceparent: header }) } })
    t.equal(res.statusCode, 200)
    await res.body.dump()
  }
  const sent = stub.requests.map((r) => String(r.headers.traceparent))
  t.equal(sent.length, 4)
  const traceIds = new Set<string>()
  for (const header of sent) {
    const match = WELL_FORMED.exec(header)
    t.ok(match, `${header} is a valid traceparent`)
    t.equal(match?.[3], '00', 'not sampled: the gateway records no spans')
    t.not(match?.[1], TRACE_ID)
    traceIds.add(match?.[1] ?? '')
  }
  t.equal(traceIds.size, 4, 'a new trace each')
})

t.test('every log line of the request carries traceId with reqId', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const chunks: string[] = []
  const stream = new Writable({ write (chunk, _enc, cb) { chunks.push(String(chunk)); cb() } })
  const { url } = await build(t, { upstreamUrl: stub.url, logger: { level: 'info', stream } })
  const ok = await request(`${url}/api/portfolio/ping`, { headers: { ...bearer(), traceparent: VALID, 'x-request-id': 'r-trace' } })
  await ok.body.dump()
  const rejected = await request(`${url}/api/portfolio/ping`, { headers: { 'x-request-id': 'r-401' } })
  await rejected.body.dump()
  const lines = chunks.join('').split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>)
  t.match(lines.filter((l) => l.reqId === 'r-trace'), [{ msg: 'request', traceId: TRACE_ID, status: 200 }])
  const fresh = lines.filter((l) => l.reqId === 'r-401')
  t.match(fresh, [{ msg: 'request rejected', code: 'UNAUTHORIZED' }, { msg: 'request', status: 401 }])
  t.match(String(fresh[0]?.traceId), /^[0-9a-f]{32}$/)
  t.equal(fresh[0]?.traceId, fresh[1]?.traceId, 'one trace id for all the lines of one request')
  const engineTrace = WELL_FORMED.exec(String(stub.requests[0]?.headers.traceparent))?.[1]
  t.equal(engineTrace, TRACE_ID, 'the id in the log is the one the engine got')
})
