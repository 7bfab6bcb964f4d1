/**
 * Load shedding (DECISIONS 15) over real sockets: an engine that stops
 * answering fills a small pool and queue, and the excess is refused with 503
 * at once while /health stays fast; an event-loop stall sheds too.
 */
import { once } from 'node:events'
import { connect } from 'node:net'
import t from 'tap'
import { request } from 'undici'
import { contractHandler, faults, startStubUpstream } from '../../fixtures/stub-upstream.js'
import { bearer, build } from '../helpers/app.js'
import { Writable } from 'node:stream'
import { watchEventLoop } from '../../src/limits/shedding.js'
import { eventually } from '../helpers/engine.js'
import { metricOf } from '../helpers/prometheus.js'

async function get (url: string, headers: Record<string, string> = {}) {
  const res = await request(url, { headers })
  const text = await res.body.text()
  return { status: res.statusCode, headers: res.headers, text }
}

t.test('a full engine queue: new /api/* requests get 503 + Retry-After at once, health stays up', async (t) => {
  const stub = await startStubUpstream(faults.hang)
  t.teardown(() => stub.close())
  // A 5 s engine timeout: a request that waited for the engine could not answer sooner.
  const lines: Array<Record<string, unknown>> = []
  const stream = new Writable({
    write (chunk, _enc, cb) {
      lines.push(JSON.parse(String(chunk)) as Record<string, unknown>)
      cb()
    }
  })
  const { metrics, url, engine } = await build(t, {
    upstreamUrl: stub.url,
    env: { UPSTREAM_TIMEOUT_MS: '5000' },
    pool: { connections: 2, maxQueue: 2 },
    logger: { level: 'info', stream }
  })

  // Two calls hold both connections, two more wait in the queue.
  const stuck = Array.from({ length: 4 }, () => get(`${url}/api/portfolio/ping`, bearer()))
  let anyStuckAnswered = false
  for (const call of stuck) {
    void call.then(() => {
      anyStuckAnswered = true
    })
  }
  t.ok(
    await eventually(() => stub.stats.started === 2 && engine.queueFull(), 4000),
    'two calls at the engine, two queued'
  )

  const shed = await get(`${url}/api/portfolio/ping`, bearer())
  t.equal(shed.status, 503)
  t.same(JSON.parse(shed.text), { error: 'gateway is overloaded, retry later' })
  t.equal(shed.headers['retry-after'], '1')
  t.ok(shed.headers['x-request-id'])
  // Order, not a clock: the refusal came while the calls ahead of it still waited on the engine.
  t.notOk(anyStuckAnswered, 'refused without waiting for the engine')

  const update = await request(`${url}/api/portfolio/update`, {
    method: 'POST',
    headers: { ...bearer(), 'content-type': 'application/json' },
    body: '{}'
  })
  t.equal(update.statusCode, 503, 'shedding comes before the body is validated')
  t.equal(update.headers.connection, 'close', 'its body unread: the connection ends')
  t.match(update.headers['x-request-id'], /^[0-9a-f-]{36}$/)
  await update.body.dump()

  // Public health is never shed.
  t.equal((await get(`${url}/health`)).status, 200)
  t.equal((await get(`${url}/ping`)).status, 200)
  t.equal(stub.stats.started, 2, 'nothing more reached the engine')
  t.equal(
    await metricOf(metrics, 'gateway_rejections_total', { reason: 'shed' }),
    2,
    'the ping and the update shed, counted'
  )
  // A refusal must cost far less than an answer: refused in front of Fastify, one warn line per
  // second of shedding with the count, no access, error or stack line per request.
  t.match(
    lines.filter((l) => !String(l.msg).startsWith('Server listening')),
    [{ level: 40, signal: 'engine queue', shed: 1, msg: /^shedding load/ }],
    'one line for both refusals'
  )

  // The engine recovers: the stuck calls get answers, and new calls go through again.
  stub.handle(contractHandler)
  stub.resetAll()
  const finished = await Promise.all(stuck)
  t.same(
    finished.map((r) => r.status),
    [200, 200, 200, 200],
    'the two at the engine are retried on a fresh connection after the reset (GETs, DECISIONS 24), the queued two served by fresh connections'
  )
  t.equal((await get(`${url}/api/portfolio/ping`, bearer())).status, 200)
})

t.test('while draining, a shed answer ends its connection too', async (t) => {
  const stub = await startStubUpstream(faults.hang)
  t.teardown(() => stub.close())
  const lifecycle = { draining: false }
  const { url, engine } = await build(t, {
    upstreamUrl: stub.url,
    env: { UPSTREAM_TIMEOUT_MS: '5000' },
    pool: { connections: 1, maxQueue: 1 },
    lifecycle
  })
  const stuck = [get(`${url}/api/portfolio/ping`, bearer()), get(`${url}/api/portfolio/ping`, bearer())]
  t.ok(
    await eventually(() => stub.stats.started === 1 && engine.queueFull(), 4000),
    'one call at the engine, one queued'
  )
  const before = await get(`${url}/api/portfolio/ping`, bearer())
  t.equal(before.status, 503)
  t.equal(before.headers.connection, 'keep-alive', 'a GET shed while serving keeps its connection')
  lifecycle.draining = true
  const during = await get(`${url}/api/portfolio/ping`, bearer())
  t.equal(during.status, 503)
  t.equal(during.headers.connection, 'close')
  stub.handle(contractHandler)
  stub.resetAll()
  await Promise.all(stuck)
})

t.test(
  'requests that arrive during an event-loop stall past SHED_EVENT_LOOP_DELAY_MS are shed; then it serves again',
  async (t) => {
    const stub = await startStubUpstream()
    t.teardown(() => stub.close())
    const { url } = await build(t, { upstreamUrl: stub.url, env: { SHED_EVENT_LOOP_DELAY_MS: '100' } })
    t.equal((await get(`${url}/api/portfolio/ping`, bearer())).status, 200, 'a calm loop serves')

    // Requests already in the gateway's sockets when this process (the gateway's)
    // stalls for 400 ms: after the stall, timers run before sockets are read.
    const { port } = new URL(url)
    const sockets = await Promise.all(
      ['/api/portfolio/ping', '/health', '/ping'].map(async (path) => {
        const socket = connect(Number(port), '127.0.0.1')
        await once(socket, 'connect')
        let text = ''
        socket.setEncoding('utf8').on('data', (chunk: string) => {
          text += chunk
        })
        const ended = once(socket, 'end').then(() => text)
        t.teardown(() => socket.destroy())
        return { socket, path, ended }
      })
    )
    for (const { socket, path } of sockets) {
      socket.end(
        `GET ${path} HTTP/1.1\r\nhost: gw\r\nauthorization: ${bearer().authorization}\r\nconnection: close\r\n\r\n`
      )
    }
    const until = performance.now() + 400
    while (performance.now() < until) {
      /* the stall */
    }
    const [api, health, ping] = await Promise.all(sockets.map((s) => s.ended))

    t.match(api, /^HTTP\/1\.1 503 /)
    t.match(api, /\r\nretry-after: 1\r\n/i)
    t.match(api, /\r\nx-request-id: /i)
    t.equal(api!.slice(api!.indexOf('\r\n\r\n') + 4), JSON.stringify({ error: 'gateway is overloaded, retry later' }))
    t.match(health, /^HTTP\/1\.1 200 /, '/health is never shed')
    t.match(ping, /^HTTP\/1\.1 200 /, '/ping is never shed')
    t.equal(stub.requests.length, 1, 'the shed request never reached the engine')

    // The next on-time tick ends it (a busy runner may take a few).
    const deadline = Date.now() + 10_000
    let status = 0
    while (status !== 200 && Date.now() < deadline) status = (await get(`${url}/api/portfolio/ping`, bearer())).status
    t.equal(status, 200, 'serves again once the loop is on time')
  }
)

t.test(
  'the event-loop watch reads the delay live: a turn of the loop that runs past the bound is lagging before the timer can fire',
  async (t) => {
    const watch = watchEventLoop(50)
    t.teardown(watch.stop)
    // Past the first tick (a 20 ms interval fires before this later 30 ms timer), then on time once a
    // tick comes on time: on a loaded runner the first may come late. A watch that starts out lagging
    // is caught by the tests above, whose first requests are served.
    await new Promise((resolve) => setTimeout(resolve, 30))
    t.ok(await eventually(() => !watch.lagging(), 5000), 'on time once a tick comes on time')
    const until = performance.now() + 120
    while (performance.now() < until) {
      /* one long turn of the loop, as a flood of reads makes */
    }
    t.equal(watch.lagging(), true, 'still inside the same turn: lagging')
    await new Promise((resolve) => setTimeout(resolve, 0))
    t.equal(watch.lagging(), true, 'the late tick holds it')
    t.ok(await eventually(() => !watch.lagging(), 5000), 'the next tick on time ends it')
  }
)

/** One raw request (the target exactly as written) and the whole answer. */
async function rawGet (url: string, target: string): Promise<string> {
  const socket = connect(Number(new URL(url).port), '127.0.0.1')
  await once(socket, 'connect')
  let text = ''
  socket.setEncoding('latin1').on('data', (c: string) => {
    text += c
  })
  socket.write(
    `GET ${target} HTTP/1.1\r\nhost: gw\r\nauthorization: ${bearer().authorization}\r\nconnection: close\r\n\r\n`
  )
  await once(socket, 'close')
  return text
}

t.test('shedding sees the path the router sees: encoded and absolute targets are /api/* too', async (t) => {
  const stub = await startStubUpstream(faults.hang)
  t.teardown(() => stub.close())
  const { url, engine } = await build(t, {
    upstreamUrl: stub.url,
    env: { UPSTREAM_TIMEOUT_MS: '5000' },
    pool: { connections: 1, maxQueue: 1 }
  })
  const stuck = [get(`${url}/api/portfolio/ping`, bearer()), get(`${url}/api/portfolio/ping`, bearer())]
  t.ok(
    await eventually(() => stub.stats.started === 1 && engine.queueFull(), 4000),
    'one call at the engine, one queued'
  )
  for (const target of [
    '/api/portfolio/ping',
    '/%61pi/portfolio/ping',
    '/%61%70%69/portfolio/ping',
    'http://gw/api/portfolio/ping',
    'HTTPS://gw:8443/api/portfolio/ping?x=1'
  ]) {
    const answer = await rawGet(url, target)
    t.match(answer, /^HTTP\/1\.1 503 Service Unavailable\r\n/, target)
    t.match(answer, /\r\nretry-after: 1\r\n/i, target)
    t.match(answer, /\r\nx-request-id: [0-9a-f-]{36}\r\n/i, target)
    t.equal(
      answer.slice(answer.indexOf('\r\n\r\n') + 4),
      JSON.stringify({ error: 'gateway is overloaded, retry later' }),
      target
    )
  }
  // Expect: 100-continue is refused with the 503 itself: the body is never invited (DECISIONS 21).
  const socket = connect(Number(new URL(url).port), '127.0.0.1')
  await once(socket, 'connect')
  let expectText = ''
  socket.setEncoding('latin1').on('data', (c: string) => {
    expectText += c
  })
  socket.write(
    `POST /api/portfolio/update HTTP/1.1\r\nhost: gw\r\nauthorization: ${bearer().authorization}\r\ncontent-type: application/json\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n`
  )
  await once(socket, 'end') // the server's FIN after its answer; the body was never sent
  socket.destroy()
  t.match(expectText, /^HTTP\/1\.1 503 Service Unavailable\r\n/, 'Expect: 100-continue gets the 503, not 100 Continue')
  t.match(expectText, /\r\nconnection: close\r\n/i)

  // The router does not fold `//` (Fastify's default): `//api/...` is no /api route, a 404 as when not overloaded.
  const doubled = await rawGet(url, '//api/portfolio/ping')
  t.match(doubled, /^HTTP\/1\.1 404 /)
  t.match(doubled, /\{"error":"no route GET \/\/api\/portfolio\/ping"\}$/)
  t.equal(stub.stats.started, 1, 'nothing shed reached the engine')
  stub.handle(contractHandler)
  stub.resetAll()
  await Promise.all(stuck)
})
