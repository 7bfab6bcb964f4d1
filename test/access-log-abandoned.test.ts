/**
 * Every request leaves exactly one access line: also a client that closes its
 * connection (FIN or RST) while the engine is still answering (status 499,
 * "clientLeft": true, written when the connection closes), and a URL the
 * router cannot read (the framework's own 400). Real sockets, a real gateway
 * and a stub engine that answers only when the test lets it.
 */
import { execFile } from 'node:child_process'
import { EventEmitter, once } from 'node:events'
import { connect, type Socket } from 'node:net'
import { Writable } from 'node:stream'
import t, { type Test } from 'tap'
import { request } from 'undici'
import { contractHandler, startStubUpstream, type StubHandler } from '../fixtures/stub-upstream.js'
import { bearer, build } from './helpers/app.js'

type Line = Record<string, unknown>

/** Generous for a loaded 2-core machine: a line is written within milliseconds of its event. */
const LINE_DEADLINE_MS = 10_000

/** The gateway's log, parsed line by line; `accessLine(id)` resolves when that request's access line is written. */
function capture (): { stream: Writable, lines: Line[], accessLines: (reqId: string) => Line[], accessLine: (reqId: string) => Promise<Line> } {
  const lines: Line[] = []
  const events = new EventEmitter()
  let partial = ''
  const stream = new Writable({
    write (chunk, _enc, cb) {
      const parts = (partial + String(chunk)).split('\n')
      partial = parts.pop() ?? ''
      for (const text of parts.filter(Boolean)) {
        const line = JSON.parse(text) as Line
        lines.push(line)
        events.emit('line', line)
      }
      cb()
    }
  })
  const accessLines = (reqId: string): Line[] => lines.filter((l) => l.msg === 'request' && l.reqId === reqId)
  const accessLine = async (reqId: string): Promise<Line> => {
    const found = accessLines(reqId)[0]
    if (found !== undefined) return found
    // A deadline, not a wait: the line comes within milliseconds or the test fails saying which is missing.
    return await new Promise((resolve, reject) => {
      const deadline = setTimeout(() => {
        events.off('line', onLine)
        reject(new Error(`no access line for ${reqId} within ${LINE_DEADLINE_MS} ms`))
      }, LINE_DEADLINE_MS)
      const onLine = (line: Line): void => {
        if (line.msg !== 'request' || line.reqId !== reqId) return
        events.off('line', onLine)
        clearTimeout(deadline)
        resolve(line)
      }
      events.on('line', onLine)
    })
  }
  return { stream, lines, accessLines, accessLine }
}

/** A stub engine that holds every answer until `release()` (later ones are answered at once), and says when a request reached it. */
async function lateEngine (t: { teardown: (fn: () => unknown) => void }): Promise<{ url: string, arrived: () => Promise<unknown>, release: () => void, paths: string[] }> {
  const arrivals = new EventEmitter()
  const held: Array<() => void> = []
  const paths: string[] = []
  let holding = true
  const handler: StubHandler = (req, res, body) => {
    paths.push(`${req.headers['x-request-id'] as string} ${req.url ?? ''}`)
    if (holding) held.push(() => { contractHandler(req, res, body) })
    else contractHandler(req, res, body)
    arrivals.emit('request')
  }
  const stub = await startStubUpstream(handler)
  t.teardown(stub.close)
  return {
    url: stub.url,
    paths,
    arrived: async () => await once(arrivals, 'request'),
    release: () => {
      holding = false
      for (const answer of held.splice(0)) answer()
    }
  }
}

/** A raw HTTP/1.1 client: writes a ping with this request id and returns the open socket. */
async function rawPing (gateway: string, reqId: string, path = '/api/portfolio/ping'): Promise<Socket> {
  const { hostname, port } = new URL(gateway)
  const socket = connect(Number(port), hostname)
  socket.on('error', () => {})
  await once(socket, 'connect')
  socket.write(`GET ${path} HTTP/1.1\r\nHost: gateway\r\nAuthorization: ${bearer().authorization}\r\nX-Request-Id: ${reqId}\r\n\r\n`)
  return socket
}

const ACCESS_FIELDS = ['level', 'time', 'pid', 'hostname', 'reqId', 'traceId', 'method', 'url', 'ip', 'status', 'ms']

/** The engine's held answer arrives after the client left: it must add no second line. A pool of one engine connection makes the next ping wait for it. */
async function afterTheLateAnswer (t: Test, gateway: string, engine: { release: () => void }, log: ReturnType<typeof capture>, reqId: string): Promise<Line> {
  // Connection: close: the answered request's connection closing after its answer must add no 499 (checked at the end).
  const next = request(`${gateway}/api/portfolio/ping`, { headers: { ...bearer(), 'x-request-id': reqId }, reset: true })
  engine.release()
  const answer = await next
  t.equal(answer.statusCode, 200)
  t.equal(await answer.body.text(), 'pong')
  const line = await log.accessLine(reqId)
  // One more request, answered after that connection closed.
  const health = await request(`${gateway}/health`, { headers: { 'x-request-id': `${reqId}-health` } })
  await health.body.text()
  await log.accessLine(`${reqId}-health`)
  t.equal(log.accessLines(reqId).length, 1, 'the answered request has one line')
  return line
}

t.test('a client that closes with FIN while the engine answers: one line, 499, when it leaves', async (t) => {
  const engine = await lateEngine(t)
  const log = capture()
  const { url } = await build(t, { upstreamUrl: engine.url, engineConnections: 1, logger: { level: 'info', stream: log.stream } })
  const started = Date.now()
  const socket = await rawPing(url, 'r-fin')
  await engine.arrived()
  socket.end()
  const line = await log.accessLine('r-fin')
  const upperMs = Date.now() - started
  t.same(Object.keys(line), [...ACCESS_FIELDS, 'clientLeft', 'msg'], 'the fixed fields, then clientLeft')
  t.match(line, { level: 30, reqId: 'r-fin', traceId: /^[0-9a-f]{32}$/, method: 'GET', url: '/api/portfolio/ping', ip: '127.0.0.1', status: 499, clientLeft: true, msg: 'request' })
  t.ok(typeof line.ms === 'number' && line.ms >= 0 && line.ms <= upperMs, `ms is the time so far (${String(line.ms)} of at most ${upperMs})`)
  t.same(log.accessLines('r-fin').length, 1, 'the line is there before the engine answered')

  const normal = await afterTheLateAnswer(t, url, engine, log, 'r-after-fin')
  t.same(Object.keys(normal), [...ACCESS_FIELDS, 'msg'], 'an answered request has no clientLeft field')
  t.match(normal, { reqId: 'r-after-fin', ip: '127.0.0.1', status: 200, msg: 'request' })
  t.equal(log.accessLines('r-fin').length, 1, 'the late engine answer wrote no second line')
})

t.test('a client that resets (RST) while the engine answers: one line, 499', async (t) => {
  const engine = await lateEngine(t)
  const log = capture()
  const { url } = await build(t, { upstreamUrl: engine.url, engineConnections: 1, logger: { level: 'info', stream: log.stream } })
  const socket = await rawPing(url, 'r-rst')
  await engine.arrived()
  socket.resetAndDestroy()
  const line = await log.accessLine('r-rst')
  t.match(line, { level: 30, reqId: 'r-rst', method: 'GET', url: '/api/portfolio/ping', ip: '127.0.0.1', status: 499, clientLeft: true, ms: Number, msg: 'request' })
  await afterTheLateAnswer(t, url, engine, log, 'r-after-rst')
  t.equal(log.accessLines('r-rst').length, 1, 'the late engine answer wrote no second line')
})

t.test('a URL the router cannot read (python3 http.client): its 400 has one access line', async (t) => {
  const log = capture()
  const { url } = await build(t, { logger: { level: 'info', stream: log.stream } })
  const { port } = new URL(url)
  const script = [
    'import http.client, sys',
    `c = http.client.HTTPConnection("127.0.0.1", ${port}, timeout=10)`,
    'c.request("GET", "/api/portfolio/%zz", headers={"X-Request-Id": "r-bad-url"})',
    'r = c.getresponse()',
    'sys.stdout.write(str(r.status) + " " + r.read().decode())'
  ].join('\n')
  const out = await new Promise<string>((resolve, reject) => {
    execFile('python3', ['-c', script], (err, stdout) => { if (err === null) resolve(stdout); else reject(err) })
  })
  t.equal(out, '400 {"error":"malformed URL"}')
  const line = await log.accessLine('r-bad-url')
  t.same(Object.keys(line), [...ACCESS_FIELDS, 'msg'])
  t.match(line, { level: 30, reqId: 'r-bad-url', traceId: /^[0-9a-f]{32}$/, method: 'GET', url: '/api/portfolio/%zz', ip: '127.0.0.1', status: 400, ms: Number, msg: 'request' })
  t.match(log.lines.filter((l) => l.reqId === 'r-bad-url').map((l) => l.msg), ['request rejected', 'request'], 'the reason, then exactly one access line')
})

t.test('a bad URL whose client leaves at once (raw socket, RST): still one line', async (t) => {
  const log = capture()
  const { url } = await build(t, { logger: { level: 'info', stream: log.stream } })
  const socket = await rawPing(url, 'r-bad-gone', '/api/portfolio/%zz')
  const [head] = await once(socket, 'data') as [Buffer]
  t.match(String(head), /^HTTP\/1\.1 400 /)
  socket.resetAndDestroy()
  t.match(await log.accessLine('r-bad-gone'), { reqId: 'r-bad-gone', status: 400, url: '/api/portfolio/%zz' })
  // A request on another connection, answered after: the bad URL's connection is closed by then.
  const other = await request(`${url}/health`, { headers: { 'x-request-id': 'r-health' } })
  await other.body.text()
  await log.accessLine('r-health')
  t.equal(log.accessLines('r-bad-gone').length, 1)
})

t.test('a call queued for the engine whose client leaves: one 499 line, and the call never reaches the engine', async (t) => {
  const engine = await lateEngine(t)
  const log = capture()
  const { url } = await build(t, { upstreamUrl: engine.url, engineConnections: 1, logger: { level: 'info', stream: log.stream } })
  const first = request(`${url}/api/portfolio/ping`, { headers: { ...bearer(), 'x-request-id': 'r-busy' } })
  await engine.arrived()
  // The one engine connection is busy: this call waits in the queue, and its client leaves.
  const socket = await rawPing(url, 'r-queued-gone')
  socket.end()
  t.match(await log.accessLine('r-queued-gone'), { reqId: 'r-queued-gone', status: 499, clientLeft: true, url: '/api/portfolio/ping' })
  const next = request(`${url}/api/portfolio/ping`, { headers: { ...bearer(), 'x-request-id': 'r-queued-next' } })
  engine.release()
  for (const pending of [first, next]) {
    const answer = await pending
    t.equal(answer.statusCode, 200)
    t.equal(await answer.body.text(), 'pong')
  }
  t.same(engine.paths, ['r-busy /api/portfolio/ping', 'r-queued-next /api/portfolio/ping'], 'the abandoned call never reached the engine')
  await log.accessLine('r-queued-next')
  t.same(['r-busy', 'r-queued-gone', 'r-queued-next'].map((id) => log.accessLines(id).map((l) => l.status)), [[200], [499], [200]])
})

t.test('a client that leaves mid-body (an update never reaches a handler): one 499 line', async (t) => {
  const log = capture()
  const { url } = await build(t, { logger: { level: 'info', stream: log.stream } })
  const { hostname, port } = new URL(url)
  const socket = connect(Number(port), hostname)
  socket.on('error', () => {})
  await once(socket, 'connect')
  // Expect: 100-continue, so the gateway says when it has admitted the request and waits for the body.
  socket.write(`POST /api/portfolio/update HTTP/1.1\r\nHost: gateway\r\nAuthorization: ${bearer().authorization}\r\n` +
    'Content-Type: application/json\r\nContent-Length: 200\r\nExpect: 100-continue\r\nX-Request-Id: r-mid-body\r\n\r\n')
  const [interim] = await once(socket, 'data') as [Buffer]
  t.match(String(interim), /^HTTP\/1\.1 100 Continue/)
  socket.write('{"portfolio_id":"p-1","target_')
  socket.end()
  t.match(await log.accessLine('r-mid-body'), { reqId: 'r-mid-body', method: 'POST', url: '/api/portfolio/update', ip: '127.0.0.1', status: 499, clientLeft: true, msg: 'request' })
  const health = await request(`${url}/health`, { headers: { 'x-request-id': 'r-mid-body-next' } })
  await health.body.text()
  await log.accessLine('r-mid-body-next')
  t.equal(log.accessLines('r-mid-body').length, 1)
})
