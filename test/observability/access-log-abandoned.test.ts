/**
 * Every request leaves exactly one access line: also a client that closes its
 * connection (FIN or RST) while the engine is still answering (status 499,
 * "clientLeft": true, written when the connection closes), a pipelined
 * request waiting behind another when its client leaves, a request the
 * server itself cuts off (its timeouts, a body cut short: the status it sent,
 * not a client that left), and a URL the router cannot read (the framework's
 * own 400). Real sockets, a real gateway and a stub engine that answers only
 * when the test lets it.
 */
import { execFile } from 'node:child_process'
import { EventEmitter, once } from 'node:events'
import { connect, type Socket } from 'node:net'
import { Writable } from 'node:stream'
import t, { type Test } from 'tap'
import { request } from 'undici'
import { contractHandler, startStubUpstream, type StubHandler } from '../../fixtures/stub-upstream.js'
import { startMetricsServer } from '../../src/observability/metrics-server.js'
import { bearer, build } from '../helpers/app.js'
import { scrape, valueOf } from '../helpers/prometheus.js'

type Line = Record<string, unknown>

/** Generous for a loaded 2-core machine: a line is written within milliseconds of its event. */
const LINE_DEADLINE_MS = 10_000

/** The gateway's log, parsed line by line; `accessLine(id)` resolves when that request's access line is written. */
function capture (): {
  stream: Writable
  lines: Line[]
  accessLines: (reqId: string) => Line[]
  accessLine: (reqId: string) => Promise<Line>
} {
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

/** A stub engine that holds every answer until `release()` (later ones are answered at once), and says when a request
 * reached it.
 */
async function lateEngine (t: {
  teardown: (fn: () => unknown) => void
}): Promise<{ url: string; arrived: () => Promise<unknown>; release: () => void; paths: string[] }> {
  const arrivals = new EventEmitter()
  const held: Array<() => void> = []
  const paths: string[] = []
  let holding = true
  const handler: StubHandler = (req, res, body) => {
    paths.push(`${req.headers['x-request-id'] as string} ${req.url ?? ''}`)
    if (holding) {
      held.push(() => {
        contractHandler(req, res, body)
      })
    } else contractHandler(req, res, body)
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
  socket.write(
    `GET ${path} HTTP/1.1\r\nHost: gateway\r\nAuthorization: ${bearer().authorization}\r\nX-Request-Id: ${reqId}\r\n\r\n`
  )
  return socket
}

const ACCESS_FIELDS = ['level', 'time', 'pid', 'hostname', 'reqId', 'traceId', 'method', 'url', 'ip', 'status', 'ms']

/** The engine's held answer arrives after the client left: it must add no second line. A pool of one engine connection
 * makes the next ping wait for it.
 */
async function afterTheLateAnswer (
  t: Test,
  gateway: string,
  engine: { release: () => void },
  log: ReturnType<typeof capture>,
  reqId: string
): Promise<Line> {
  // Connection: close: the answered request's connection closing after its answer must add no 499 (checked at the end).
  const next = request(`${gateway}/api/portfolio/ping`, {
    headers: { ...bearer(), 'x-request-id': reqId },
    reset: true
  })
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
  const { url } = await build(t, {
    upstreamUrl: engine.url,
    engineConnections: 1,
    logger: { level: 'info', stream: log.stream }
  })
  const started = Date.now()
  const socket = await rawPing(url, 'r-fin')
  await engine.arrived()
  socket.end()
  const line = await log.accessLine('r-fin')
  const upperMs = Date.now() - started
  t.same(Object.keys(line), [...ACCESS_FIELDS, 'clientLeft', 'msg'], 'the fixed fields, then clientLeft')
  t.match(line, {
    level: 30,
    reqId: 'r-fin',
    traceId: /^[0-9a-f]{32}$/,
    method: 'GET',
    url: '/api/portfolio/ping',
    ip: '127.0.0.1',
    status: 499,
    clientLeft: true,
    msg: 'request'
  })
  t.ok(
    typeof line.ms === 'number' && line.ms >= 0 && line.ms <= upperMs,
    `ms is the time so far (${String(line.ms)} of at most ${upperMs})`
  )
  t.same(log.accessLines('r-fin').length, 1, 'the line is there before the engine answered')

  const normal = await afterTheLateAnswer(t, url, engine, log, 'r-after-fin')
  t.same(Object.keys(normal), [...ACCESS_FIELDS, 'msg'], 'an answered request has no clientLeft field')
  t.match(normal, { reqId: 'r-after-fin', ip: '127.0.0.1', status: 200, msg: 'request' })
  t.equal(log.accessLines('r-fin').length, 1, 'the late engine answer wrote no second line')
})

t.test('a client that resets (RST) while the engine answers: one line, 499', async (t) => {
  const engine = await lateEngine(t)
  const log = capture()
  const { url } = await build(t, {
    upstreamUrl: engine.url,
    engineConnections: 1,
    logger: { level: 'info', stream: log.stream }
  })
  const socket = await rawPing(url, 'r-rst')
  await engine.arrived()
  socket.resetAndDestroy()
  const line = await log.accessLine('r-rst')
  t.match(line, {
    level: 30,
    reqId: 'r-rst',
    method: 'GET',
    url: '/api/portfolio/ping',
    ip: '127.0.0.1',
    status: 499,
    clientLeft: true,
    ms: Number,
    msg: 'request'
  })
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
    execFile('python3', ['-c', script], (err, stdout) => {
      if (err === null) resolve(stdout)
      else reject(err)
    })
  })
  t.equal(out, '400 {"error":"malformed URL"}')
  const line = await log.accessLine('r-bad-url')
  t.same(Object.keys(line), [...ACCESS_FIELDS, 'msg'])
  t.match(line, {
    level: 30,
    reqId: 'r-bad-url',
    traceId: /^[0-9a-f]{32}$/,
    method: 'GET',
    url: '/api/portfolio/%zz',
    ip: '127.0.0.1',
    status: 400,
    ms: Number,
    msg: 'request'
  })
  t.match(
    log.lines.filter((l) => l.reqId === 'r-bad-url').map((l) => l.msg),
    ['request rejected', 'request'],
    'the reason, then exactly one access line'
  )
})

t.test('a bad URL whose client leaves at once (raw socket, RST): still one line', async (t) => {
  const log = capture()
  const { url } = await build(t, { logger: { level: 'info', stream: log.stream } })
  const socket = await rawPing(url, 'r-bad-gone', '/api/portfolio/%zz')
  const [head] = (await once(socket, 'data')) as [Buffer]
  t.match(String(head), /^HTTP\/1\.1 400 /)
  socket.resetAndDestroy()
  t.match(await log.accessLine('r-bad-gone'), { reqId: 'r-bad-gone', status: 400, url: '/api/portfolio/%zz' })
  // A request on another connection, answered after: the bad URL's connection is closed by then.
  const other = await request(`${url}/health`, { headers: { 'x-request-id': 'r-health' } })
  await other.body.text()
  await log.accessLine('r-health')
  t.equal(log.accessLines('r-bad-gone').length, 1)
})

t.test(
  'a call queued for the engine whose client leaves: one 499 line, and the call never reaches the engine',
  async (t) => {
    const engine = await lateEngine(t)
    const log = capture()
    const { url } = await build(t, {
      upstreamUrl: engine.url,
      engineConnections: 1,
      logger: { level: 'info', stream: log.stream }
    })
    const first = request(`${url}/api/portfolio/ping`, { headers: { ...bearer(), 'x-request-id': 'r-busy' } })
    await engine.arrived()
    // The one engine connection is busy: this call waits in the queue, and its client leaves.
    const socket = await rawPing(url, 'r-queued-gone')
    socket.end()
    t.match(await log.accessLine('r-queued-gone'), {
      reqId: 'r-queued-gone',
      status: 499,
      clientLeft: true,
      url: '/api/portfolio/ping'
    })
    const next = request(`${url}/api/portfolio/ping`, { headers: { ...bearer(), 'x-request-id': 'r-queued-next' } })
    engine.release()
    for (const pending of [first, next]) {
      const answer = await pending
      t.equal(answer.statusCode, 200)
      t.equal(await answer.body.text(), 'pong')
    }
    t.same(
      engine.paths,
      ['r-busy /api/portfolio/ping', 'r-queued-next /api/portfolio/ping'],
      'the abandoned call never reached the engine'
    )
    await log.accessLine('r-queued-next')
    t.same(
      ['r-busy', 'r-queued-gone', 'r-queued-next'].map((id) => log.accessLines(id).map((l) => l.status)),
      [[200], [499], [200]]
    )
  }
)

/** A raw update whose body stops after a few bytes: the request is in the framework, waiting for the rest. */
async function partialUpdate (
  gateway: string,
  reqId: string,
  expectContinue = false
): Promise<{ socket: Socket; received: () => string; closed: Promise<unknown> }> {
  const { hostname, port } = new URL(gateway)
  const socket = connect(Number(port), hostname)
  socket.on('error', () => {})
  await once(socket, 'connect')
  let received = ''
  socket.on('data', (chunk: Buffer) => {
    received += String(chunk)
  })
  const closed = once(socket, 'close')
  socket.write(
    `POST /api/portfolio/update HTTP/1.1\r\nHost: gateway\r\nAuthorization: ${bearer().authorization}\r\n` +
      `Content-Type: application/json\r\nContent-Length: 200\r\n${expectContinue ? 'Expect: 100-continue\r\n' : ''}X-Request-Id: ${reqId}\r\n\r\n`
  )
  if (expectContinue) {
    // The gateway says when it has admitted the request and waits for the body.
    const [interim] = (await once(socket, 'data')) as [Buffer]
    if (!String(interim).startsWith('HTTP/1.1 100 Continue')) { throw new Error(`expected 100 Continue, got ${String(interim)}`) }
    received = ''
  }
  socket.write('{"portfolio_id":"p-1","target_')
  return { socket, received: () => received, closed }
}

/** The raw answer's status line, request id and body. */
/** One more request, and its line: every line of `reqId` is written by then; exactly one of them. */
async function onlyOneLine (t: Test, gateway: string, log: ReturnType<typeof capture>, reqId: string): Promise<void> {
  const health = await request(`${gateway}/health`, { headers: { 'x-request-id': `${reqId}-next` } })
  await health.body.text()
  await log.accessLine(`${reqId}-next`)
  t.equal(log.accessLines(reqId).length, 1)
}

function rawAnswer (text: string): { status: string; requestId: string | undefined; body: string } {
  const [head = '', body = ''] = text.split('\r\n\r\n')
  return { status: head.split('\r\n')[0] ?? '', requestId: /^x-request-id: (.*)$/im.exec(head)?.[1], body }
}

t.test(
  'a client that half-closes (FIN) mid-body: it gets a 400 with its request id, and the line says 400',
  async (t) => {
    const log = capture()
    const { url } = await build(t, { logger: { level: 'info', stream: log.stream } })
    const update = await partialUpdate(url, 'r-mid-body', true)
    update.socket.end()
    await update.closed
    t.same(
      rawAnswer(update.received()),
      { status: 'HTTP/1.1 400 Bad Request', requestId: 'r-mid-body', body: '{"error":"malformed HTTP request"}' },
      'the answer the client can still read carries its request id'
    )
    const line = await log.accessLine('r-mid-body')
    t.same(Object.keys(line), [...ACCESS_FIELDS, 'msg'], 'no clientLeft: the line shows what was answered')
    t.match(line, {
      reqId: 'r-mid-body',
      method: 'POST',
      url: '/api/portfolio/update',
      ip: '127.0.0.1',
      status: 400,
      msg: 'request'
    })
    await onlyOneLine(t, url, log, 'r-mid-body')
  }
)

t.test('a client that resets (RST) mid-body: one 499 line', async (t) => {
  const log = capture()
  const { url } = await build(t, { logger: { level: 'info', stream: log.stream } })
  const update = await partialUpdate(url, 'r-mid-body-rst', true)
  update.socket.resetAndDestroy()
  t.match(await log.accessLine('r-mid-body-rst'), {
    reqId: 'r-mid-body-rst',
    method: 'POST',
    url: '/api/portfolio/update',
    status: 499,
    clientLeft: true,
    msg: 'request'
  })
  await onlyOneLine(t, url, log, 'r-mid-body-rst')
})

// The server's own timeouts are shortened on app.server: the real ones (180 s for a request, the idle
// timeout of config) are far too long for a test. Node checks the request timeout every second
// (connectionsCheckingInterval), so the cut comes 1 to 2 s after the body stopped.
t.test(
  'the request timeout while a body trickles in: a raw 408 with the request id, and the line says 408',
  async (t) => {
    const log = capture()
    const { app, url } = await build(t, { logger: { level: 'info', stream: log.stream } })
    app.server.headersTimeout = 500
    app.server.requestTimeout = 1000
    const update = await partialUpdate(url, 'r-request-timeout')
    await update.closed
    t.same(rawAnswer(update.received()), {
      status: 'HTTP/1.1 408 Request Timeout',
      requestId: 'r-request-timeout',
      body: '{"error":"request timed out"}'
    })
    const line = await log.accessLine('r-request-timeout')
    t.same(Object.keys(line), [...ACCESS_FIELDS, 'msg'], 'no clientLeft: the server cut it off')
    t.match(line, {
      reqId: 'r-request-timeout',
      method: 'POST',
      url: '/api/portfolio/update',
      status: 408,
      msg: 'request'
    })
  }
)

t.test('the idle timeout while a request waits: the line says 408, not that the client left', async (t) => {
  const log = capture()
  const { app, url } = await build(t, { logger: { level: 'info', stream: log.stream } })
  // Applies to connections accepted from now on.
  app.server.timeout = 1000
  const started = Date.now()
  const update = await partialUpdate(url, 'r-idle-timeout')
  await update.closed
  t.ok(Date.now() - started >= 900, 'the server closed the connection at its idle timeout')
  t.equal(update.received(), '', 'the connection is closed without an answer, as Node does')
  const line = await log.accessLine('r-idle-timeout')
  t.same(Object.keys(line), [...ACCESS_FIELDS, 'msg'], 'no clientLeft: the client was still there')
  t.match(line, { reqId: 'r-idle-timeout', method: 'POST', url: '/api/portfolio/update', status: 408, msg: 'request' })
})

/** Two pings pipelined on one connection, the second waiting behind the first (held by the engine), then the client
 * leaves.
 */
async function pipelinedClientLeaves (t: Test, leave: (socket: Socket) => void, ids: [string, string]): Promise<void> {
  const engine = await lateEngine(t)
  const log = capture()
  const built = await build(t, {
    upstreamUrl: engine.url,
    engineConnections: 1,
    logger: { level: 'info', stream: log.stream }
  })
  const { url } = built
  const metrics = await startMetricsServer(built.metrics, { port: 0, host: '127.0.0.1' })
  t.teardown(metrics.close)
  const inFlight = async (): Promise<number | undefined> =>
    valueOf((await scrape(`http://127.0.0.1:${metrics.port}`)).samples, 'gateway_requests_in_flight')

  const { hostname, port } = new URL(url)
  const socket = connect(Number(port), hostname)
  socket.on('error', () => {})
  await once(socket, 'connect')
  const ping = (id: string): string =>
    `GET /api/portfolio/ping HTTP/1.1\r\nHost: gateway\r\nAuthorization: ${bearer().authorization}\r\nX-Request-Id: ${id}\r\n\r\n`
  socket.write(ping(ids[0]) + ping(ids[1]))
  await engine.arrived()
  leave(socket)
  for (const id of ids) {
    t.match(await log.accessLine(id), {
      reqId: id,
      method: 'GET',
      url: '/api/portfolio/ping',
      status: 499,
      clientLeft: true,
      msg: 'request'
    })
  }
  t.equal(await inFlight(), 0, 'both requests have left the in-flight gauge')

  // The engine's one connection frees up: a call still queued for the waiting request would go before this one.
  const next = request(`${url}/api/portfolio/ping`, { headers: { ...bearer(), 'x-request-id': `${ids[1]}-next` } })
  engine.release()
  const answer = await next
  t.equal(answer.statusCode, 200)
  t.equal(await answer.body.text(), 'pong')
  await log.accessLine(`${ids[1]}-next`)
  t.same(
    engine.paths,
    [`${ids[0]} /api/portfolio/ping`, `${ids[1]}-next /api/portfolio/ping`],
    'the waiting request never reached the engine'
  )
  t.same(
    ids.map((id) => log.accessLines(id).length),
    [1, 1],
    'one line each'
  )
  t.equal(await inFlight(), 0)
}

t.test(
  'two pipelined pings whose client closes (FIN): a 499 line each, the waiting one never reaches the engine',
  async (t) => {
    await pipelinedClientLeaves(t, (socket) => socket.end(), ['p-fin-1', 'p-fin-2'])
  }
)

t.test(
  'two pipelined pings whose client resets (RST): a 499 line each, the waiting one never reaches the engine',
  async (t) => {
    await pipelinedClientLeaves(t, (socket) => socket.resetAndDestroy(), ['p-rst-1', 'p-rst-2'])
  }
)

t.test(
  'an engine that answers 499 itself: a 502 (no status the contract names), and the line does not say the client left',
  async (t) => {
    const engineError = {
      success: false,
      error: { source: 'engine', code: 'CLIENT_CLOSED', message: 'closed', function: 'ping' }
    }
    const stub = await startStubUpstream((req, res) => {
      if (req.url !== '/api/portfolio/ping') return contractHandler(req, res, Buffer.alloc(0))
      res.writeHead(499, { 'content-type': 'application/json' })
      res.end(JSON.stringify(engineError))
    })
    t.teardown(stub.close)
    const log = capture()
    const { url } = await build(t, { upstreamUrl: stub.url, logger: { level: 'info', stream: log.stream } })
    const res = await request(`${url}/api/portfolio/ping`, { headers: { ...bearer(), 'x-request-id': 'r-engine-499' } })
    t.equal(res.statusCode, 502)
    t.same(await res.body.json(), { error: 'portfolio engine sent an invalid response' })
    const line = await log.accessLine('r-engine-499')
    t.same(Object.keys(line), [...ACCESS_FIELDS, 'msg'], 'no clientLeft: the client stayed for its answer')
    t.match(line, { reqId: 'r-engine-499', status: 502, msg: 'request' })
  }
)

t.test(
  'a complete request with a malformed one pipelined behind it: the first keeps its answer and line, then the 400, then the close',
  async (t) => {
    const engine = await lateEngine(t)
    const log = capture()
    const { url } = await build(t, { upstreamUrl: engine.url, logger: { level: 'info', stream: log.stream } })
    const { hostname, port } = new URL(url)
    const socket = connect(Number(port), hostname)
    socket.on('error', () => {})
    await once(socket, 'connect')
    let received = ''
    socket.setEncoding('latin1').on('data', (chunk: string) => {
      received += chunk
    })
    // One write: the parser fails on the second request while the first waits for the engine.
    socket.write(
      `GET /api/portfolio/ping HTTP/1.1\r\nHost: gateway\r\nAuthorization: ${bearer().authorization}\r\nX-Request-Id: pl-first\r\n\r\nBAD LINE HERE\r\n\r\n`
    )
    await engine.arrived()
    // More bytes after the bad line, read after the parser failed: each chunk is another error, and still one 400 goes
    // out.
    socket.write('MORE GARBAGE\r\n\r\n')
    await new Promise((resolve) => setImmediate(resolve))
    engine.release()
    await once(socket, 'close')
    const answers = received.split(/(?=HTTP\/1\.1 )/)
    t.equal(answers.length, 2, 'two answers, no more')
    const [first = '', second = ''] = answers
    t.match(first, /^HTTP\/1\.1 200 OK\r\n/, "the first request gets the engine's answer")
    t.equal(rawAnswer(first).requestId, 'pl-first')
    t.match(first, /\r\nconnection: close\r\n/i, 'and says the connection ends')
    t.equal(rawAnswer(first).body, 'pong')
    t.same(
      { ...rawAnswer(second), requestId: /^[0-9a-f-]{36}$/.test(rawAnswer(second).requestId ?? '') },
      { status: 'HTTP/1.1 400 Bad Request', requestId: true, body: '{"error":"malformed HTTP request"}' },
      "then the malformed request's 400, with an id of its own"
    )
    t.match(await log.accessLine('pl-first'), { reqId: 'pl-first', status: 200, msg: 'request' })
    t.same(log.accessLines('pl-first').length, 1)
  }
)
