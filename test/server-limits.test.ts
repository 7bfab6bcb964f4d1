/**
 * The server side of "bounded time": every Node server limit is set, none left
 * At its default. The values are literals: a constant changed
 * by mistake fails here, instead of being compared with itself. Then the
 * relations between the gateway's limits and the reference engine's.
 */
import { connect } from 'node:net'
import t from 'tap'
import { build } from './helpers/app.js'
import { startEngine } from './helpers/engine.js'

t.test('server timeouts and header limits are the documented ones', async (t) => {
  const { app } = await build(t)
  t.equal(app.server.requestTimeout, 180_000, 'a whole request: three minutes for a 10 MiB upload from a phone')
  t.equal(app.server.headersTimeout, 10_000, 'request line and headers')
  t.equal((app.server as typeof app.server & { connectionsCheckingInterval: number }).connectionsCheckingInterval, 1_000, 'both checked every second, so each holds within 1 s (Node\'s default: every 30 s)')
  t.equal(app.server.keepAliveTimeout, 72_000, 'idle keep-alive socket')
  t.equal(app.server.timeout, 60_000, 'idle socket; UPSTREAM_TIMEOUT_MS=1000: the floor')
  t.equal(app.server.maxHeadersCount, 64)
  t.equal(app.initialConfig.bodyLimit, 65_536, 'JSON bodies')
})

t.test('a headers timeout fires on time: within the checking interval of its value', async (t) => {
  const { app, url } = await build(t)
  // Node reads headersTimeout at each check; the interval is the real one (1 s).
  app.server.headersTimeout = 1_500
  const socket = connect(Number(new URL(url).port), '127.0.0.1')
  t.teardown(() => socket.destroy())
  let text = ''
  socket.setEncoding('latin1').on('data', (c: string) => { text += c })
  const closed = new Promise((resolve) => socket.on('close', resolve))
  const from = performance.now()
  socket.write('GET /ping HTTP/1.1\r\nhost: x\r\n') // and never the blank line
  await closed
  const ms = performance.now() - from
  t.match(text, /^HTTP\/1\.1 408 Request Timeout\r\n/)
  t.match(text, /\{"error":"request timed out"\}$/)
  // With Node's 30 s interval the 408 would come up to 30 s late; a loaded runner gets 1.5 s of slack.
  t.ok(ms >= 1_400 && ms < 1_500 + 1_000 + 1_500, `408 after ${Math.round(ms)} ms`)
})

t.test('the gateway\'s limits hold together', async (t) => {
  const { app } = await build(t)
  const s = app.server
  t.ok(s.headersTimeout < s.requestTimeout, 'headers come before the whole request is due (Node requires headersTimeout <= requestTimeout)')
  t.ok(s.keepAliveTimeout > 60_000, 'above the 60 s idle timeout of common load balancers, so the balancer closes first')
  t.ok(s.timeout > 30_000, 'the idle limit is above the 30 s upload stall limit: a stalled engine gets a 504 before the client socket is dropped')
})

t.test('the reference engine\'s limits are at least the gateway\'s', async (t) => {
  const gateway = (await build(t)).app.server
  const { engine } = await startEngine(t)
  t.equal(engine.server.keepAliveTimeout, 72_000)
  t.equal(engine.server.timeout, 0, 'no idle limit of its own: requestTimeout bounds a request')
  t.equal(engine.initialConfig.bodyLimit, 65_536, 'an update body: the gateway forwards at most 64 KiB, re-serialised')
  t.ok(engine.server.keepAliveTimeout > 60_000, 'longer than the gateway pool keeps a socket (undici caps keep-alive hints at keepAliveMaxTimeout, 60 s), so the engine never closes a socket the pool is about to reuse')
  t.ok(engine.server.keepAliveTimeout >= gateway.keepAliveTimeout)
})

// The gateway streams an upload to the engine as it arrives, so the engine
// request lasts as long as the client's (up to the gateway's requestTimeout,
// 180 s) plus the wait for the engine: with a shorter engine requestTimeout, a
// Slow upload the gateway accepts would fail at the engine as a 502.
t.test('the engine\'s requestTimeout covers the gateway\'s upload allowance', async (t) => {
  const gateway = (await build(t)).app.server
  const { engine } = await startEngine(t)
  t.equal(engine.server.requestTimeout, 780_000, 'the engine waits 13 minutes for a request')
  t.ok(engine.server.requestTimeout >= gateway.requestTimeout + 600_000, `engine ${engine.server.requestTimeout} ms >= gateway ${gateway.requestTimeout} ms + the longest UPSTREAM_TIMEOUT_MS`)
})

t.test('a long UPSTREAM_TIMEOUT_MS lengthens the idle limit, so the client is still there for the 504', async (t) => {
  const { app } = await build(t, { env: { UPSTREAM_TIMEOUT_MS: '120000' } })
  t.equal(app.server.timeout, 125_000)
})

// Node 24's parser refuses a request with more headers than maxHeadersCount (HPE_HEADER_OVERFLOW, our 431);
// Node 22's drops the extra headers unparsed. Either way a header past the 64th is never read.
t.test('more headers than maxHeadersCount are never parsed', async (t) => {
  const { url } = await build(t)
  const { port } = new URL(url)
  const ask = async (count: number, position: number): Promise<string> => {
    const socket = connect(Number(port), '127.0.0.1')
    const filler = Array.from({ length: count }, (_, i) => `x-h${i}: v`)
    filler.splice(position, 0, 'x-request-id: mine')
    socket.write(`GET /ping HTTP/1.1\r\nHost: x\r\n${filler.join('\r\n')}\r\nConnection: close\r\n\r\n`)
    const chunks: Buffer[] = []
    socket.on('data', (c: Buffer) => chunks.push(c))
    await new Promise((resolve) => socket.on('close', resolve))
    return Buffer.concat(chunks).toString()
  }
  const within = await ask(50, 10)
  t.match(within, /^HTTP\/1\.1 200 OK/)
  t.match(within, /x-request-id: mine\r\n/i, 'a header within the first 64 is read')
  const past = await ask(100, 90)
  t.notMatch(past, /x-request-id: mine\r\n/i, 'a header past the 64th is never parsed (Node\'s default would read 2000)')
  if (Number(process.versions.node.split('.')[0]) >= 24) {
    t.match(past, /^HTTP\/1\.1 431 Request Header Fields Too Large\r\n/)
    t.match(past, /\r\n\r\n\{"error":"request headers too large"\}$/)
  } else {
    t.match(past, /^HTTP\/1\.1 200 OK/)
  }
})
