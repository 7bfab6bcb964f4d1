/** Logs at 3 a.m.: one line per request with its id, the reason for a rejection, a 5xx with its cause, never a token.
 *
 */
import { Writable } from 'node:stream'
import t from 'tap'
import { refusedPort, startStubUpstream } from '../../fixtures/stub-upstream.js'
import { bearer, build, hs256 } from '../helpers/app.js'

function capture (): { stream: Writable, lines: () => Array<Record<string, unknown>> } {
  const chunks: string[] = []
  const stream = new Writable({ write (chunk, _enc, cb) { chunks.push(String(chunk)); cb() } })
  return { stream, lines: () => chunks.join('').split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>) }
}

t.test('info: one access line per request, rejections say why, tokens never appear', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const log = capture()
  const { app } = await build(t, { upstreamUrl: stub.url, logger: { level: 'info', stream: log.stream } })
  const token = hs256()
  await app.inject({ url: '/api/portfolio/ping', headers: { ...bearer(token), 'x-request-id': 'r-ok' } })
  await app.inject({ url: '/api/portfolio/ping', headers: { ...bearer(hs256({ exp: 1 })), 'x-request-id': 'r-401' } })
  const lines = log.lines()
  t.match(lines.filter((l) => l.msg === 'request'), [
    { reqId: 'r-ok', method: 'GET', url: '/api/portfolio/ping', status: 200, ms: Number },
    { reqId: 'r-401', method: 'GET', url: '/api/portfolio/ping', status: 401 }
  ])
  t.match(lines.find((l) => l.msg === 'request rejected'), { reqId: 'r-401', code: 'UNAUTHORIZED', reason: 'token expired' })
  const text = JSON.stringify(lines)
  t.notMatch(text, token.split('.')[2]!, 'no token in the logs')
  t.notMatch(text, /authorization/i)
})

t.test('a 5xx is logged at error with its cause; the client gets no internals', async (t) => {
  const port = await refusedPort()
  const log = capture()
  const { app } = await build(t, { upstreamUrl: `http://127.0.0.1:${port}`, logger: { level: 'warn', stream: log.stream } })
  const res = await app.inject({ url: '/api/portfolio/ping', headers: { ...bearer(), 'x-request-id': 'r-502' } })
  t.same(res.json(), { error: 'portfolio engine unavailable' })
  const lines = log.lines()
  t.equal(lines.filter((l) => l.msg === 'request').length, 0, 'no access lines at warn')
  t.match(lines, [{ level: 50, reqId: 'r-502', code: 'UPSTREAM_UNAVAILABLE', err: { code: 'ECONNREFUSED' }, msg: 'portfolio engine unavailable' }])
})

t.test("the gateway's own 503 is one warn line without a stack", async (t) => {
  const log = capture()
  const { app } = await build(t, { upstreamUrl: 'http://127.0.0.1:9', env: { REDIS_URL: 'redis://127.0.0.1:9' }, logger: { level: 'warn', stream: log.stream } })
  const res = await app.inject({
    method: 'POST',
    url: '/api/portfolio/update',
    headers: { ...bearer(), 'content-type': 'application/json', 'idempotency-key': 'k-1', 'x-request-id': 'r-503' },
    payload: JSON.stringify({ portfolio_id: 'p-1', target_positions: [{ mint: 'So11111111111111111111111111111111111111112', allocation: 1 }] })
  })
  t.equal(res.statusCode, 503)
  t.same(res.json(), { error: 'idempotency store unavailable, retry later' })
  const refused = log.lines().filter((l) => l.reqId === 'r-503' && l.msg === 'request refused, retry later')
  t.match(refused, [{ level: 40, code: 'IDEMPOTENCY_STORE_UNAVAILABLE', reason: 'idempotency store unavailable, retry later' }])
  t.same(log.lines().filter((l) => ((l.err as { stack?: string } | undefined)?.stack ?? '') !== '').map((l) => l.msg), [], 'no stack trace logged')
  t.equal(log.lines().filter((l) => l.level === 50).length, 0, 'nothing at error level')
})
