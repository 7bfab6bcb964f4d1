/**
 * DECISIONS 23: a create's place under the per-user cap and its upload
 * connection are held while its engine request runs, over real sockets:
 * - a client that sends its whole form and hangs up does not give its place
 *   back while the engine still has its upload;
 * - a client invited with `100 Continue` that then sends nothing (or
 *   trickles) is timed from the invitation: 408, and its upload connection
 *   goes to the next create.
 */
import { once } from 'node:events'
import { createServer, type Server } from 'node:http'
import { connect, type Socket } from 'node:net'
import t, { type Test } from 'tap'
import { request } from 'undici'
import { build, hs256 } from '../../helpers/app.js'
import { CREATE_FIELDS, imagePart, multipartBody, pngOfSize } from '../../helpers/multipart.js'
import { eventually } from '../../helpers/engine.js'
import { startStubUpstream } from '../../../fixtures/stub-upstream.js'
import { listenOnLoopback } from '../../helpers/processes.js'

const FORM = multipartBody([...CREATE_FIELDS, imagePart(pngOfSize(64 * 1024))])

/**
 * An engine that reads each form and holds its answer to the first `held` creates until the test calls `release()`,
 * answering any other at once; counts the creates it has at once.
 */
async function heldEngine (
  t: Test,
  held: number
): Promise<{ url: string; stats: { active: number; most: number; started: number }; release: () => void }> {
  const stats = { active: 0, most: 0, started: 0 }
  let release!: () => void
  const released = new Promise<void>((resolve) => { release = resolve })
  const server: Server = createServer((req, res) => {
    stats.started++
    stats.active++
    stats.most = Math.max(stats.most, stats.active)
    const id = stats.started
    res.on('close', () => {
      stats.active--
    })
    req.resume()
    req.on('end', () => {
      void (id <= held ? released : Promise.resolve()).then(() => {
        res.writeHead(200, { 'content-type': 'application/json' })
        res.end(JSON.stringify({ portfolio_id: `p-${id}` }))
      })
    })
  })
  server.keepAliveTimeout = 500
  return { url: `http://127.0.0.1:${await listenOnLoopback(t, server)}`, stats, release }
}

/** Send the whole create on a raw socket and hang up once `ready` says so; resolves with what was read by then. */
async function sendAndHangUp (url: string, sub: string, ready: (got: string) => boolean): Promise<string> {
  const socket = connect(Number(new URL(url).port), '127.0.0.1')
  socket.on('error', () => {})
  await once(socket, 'connect')
  let got = ''
  socket.setEncoding('latin1').on('data', (chunk: string) => {
    got += chunk
  })
  socket.write(
    `POST /api/portfolio/create HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${hs256({ sub })}\r\ncontent-type: ${FORM.contentType}\r\ncontent-length: ${FORM.body.length}\r\n\r\n`
  )
  socket.write(FORM.body)
  const closed = once(socket, 'close')
  if (!(await eventually(() => ready(got), 10_000))) {
    socket.destroy()
    throw new Error('not ready to hang up within 10 s')
  }
  socket.destroy()
  await closed
  return got
}

async function create (url: string, sub: string): Promise<{ status: number; body: unknown }> {
  const res = await request(`${url}/api/portfolio/create`, {
    method: 'POST',
    headers: { authorization: `Bearer ${hs256({ sub })}`, 'content-type': FORM.contentType },
    body: FORM.body
  })
  return { status: res.statusCode, body: await res.body.json() }
}

const CAPPED = { error: 'at most 2 uploads per user at once' }

t.test('creates whose clients hang up once the form is sent keep their places until the engine answers', async (t) => {
  // The engine answers the user's first two creates only when released, after the fourth create (a gateway that gave
  // their places back would have its third and fourth answered at once): UPSTREAM_TIMEOUT_MS, the file's own 60 s,
  // must not answer the held creates first, however slow the machine.
  const engine = await heldEngine(t, 2)
  const { url, app } = await build(t, {
    upstreamUrl: engine.url,
    env: { UPLOAD_MAX_PER_USER: '2', UPSTREAM_TIMEOUT_MS: '60000' }
  })
  // Teardowns run last first: should the test end early, the engine answers before the gateway closes its pool.
  t.teardown(engine.release)
  let connections = 0
  app.server.on('connection', (socket: Socket) => {
    connections++
    socket.once('close', () => { connections-- })
  })
  // Two creates send their whole form and hang up once both are at the engine, which holds its answers.
  const atEngine = (): boolean => engine.stats.active === 2
  const [first, second] = await Promise.all([sendAndHangUp(url, 'leaver', atEngine), sendAndHangUp(url, 'leaver', atEngine)])
  t.equal(first, '', 'no answer before the hang-up')
  t.equal(second, '')
  t.equal(engine.stats.active, 2, 'both are at the engine after their clients left')
  // The gateway has seen both hang-ups once it holds no connection of theirs.
  t.ok(await eventually(() => connections === 0, 5_000), 'the gateway saw both clients leave')
  const third = await sendAndHangUp(url, 'leaver', (got) => got.includes('}'))
  t.match(third, /^HTTP\/1\.1 429 Too Many Requests\r\n/, 'a third create of the user is refused')
  t.same(JSON.parse(third.slice(third.indexOf('\r\n\r\n') + 4)), CAPPED)
  t.equal(engine.stats.active, 2, 'still two at the engine')
  const fourth = await create(url, 'leaver')
  t.equal(engine.stats.active, 2, 'the fourth was answered while two were at the engine')
  t.same(fourth, { status: 429, body: CAPPED })
  engine.release()
  t.ok(await eventually(() => engine.stats.active === 0, 10_000), 'the engine answered both')
  t.equal(engine.stats.most, 2, 'the engine never had more than two creates of the user at once')
  t.equal(engine.stats.started, 2)
  // Their places came back with the engine's answers, though nobody read them.
  const fifth = await create(url, 'leaver')
  t.equal(fifth.status, 200, 'a create once the engine has answered')
})

/**
 * A create that sends `Expect: 100-continue` and reads the invitation; `answer`
 * then sends `pace` (or nothing) and resolves with what it reads until the gateway closes.
 */
async function invited (
  t: Test,
  url: string,
  sub: string
): Promise<(pace?: { bytes: number; everyMs: number }) => Promise<string>> {
  const socket = connect(Number(new URL(url).port), '127.0.0.1')
  t.teardown(() => socket.destroy())
  socket.on('error', () => {})
  await once(socket, 'connect')
  let got = ''
  socket.setEncoding('latin1').on('data', (chunk: string) => {
    got += chunk
  })
  socket.write(
    `POST /api/portfolio/create HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${hs256({ sub })}\r\ncontent-type: ${FORM.contentType}\r\ncontent-length: ${FORM.body.length}\r\nexpect: 100-continue\r\n\r\n`
  )
  while (!got.includes('\r\n\r\n')) await once(socket, 'data')
  t.equal(got, 'HTTP/1.1 100 Continue\r\n\r\n', `${sub} is invited`)
  got = ''
  return async (pace) => {
    let sent = 0
    const trickle =
      pace === undefined
        ? undefined
        : setInterval(() => {
            if (socket.destroyed || got !== '') return
            socket.write(FORM.body.subarray(sent, sent + pace.bytes))
            sent += pace.bytes
          }, pace.everyMs)
    t.teardown(() => clearInterval(trickle))
    await once(socket, 'close')
    clearInterval(trickle)
    return got
  }
}

const INVITED_CASES = [
  {
    name: 'silent after the invitation (no byte for 1 s)',
    rule: { stallMs: 1_000, windowMs: 60_000, bytesPerS: 1, tickMs: 100 },
    pace: undefined,
    message: 'upload stalled: no byte for 1 s'
  },
  {
    name: 'trickling after the invitation (10 bytes every 100 ms, under 1000 bytes/s over 2 s)',
    rule: { stallMs: 60_000, windowMs: 2_000, bytesPerS: 1000, tickMs: 100 },
    pace: { bytes: 10, everyMs: 100 },
    message: 'upload too slow: under 1000 bytes/s over 2 s'
  }
]

for (const { name, rule, pace, message } of INVITED_CASES) {
  t.test(`a client ${name} is cut off with 408 and its upload connection goes to the next create`, async (t) => {
    const stub = await startStubUpstream()
    t.teardown(stub.close)
    const { url } = await build(t, {
      upstreamUrl: stub.url,
      uploadMinRate: rule,
      env: { UPLOAD_MAX_CONNECTIONS: '1', UPSTREAM_TIMEOUT_MS: '30000' }
    })
    const send = await invited(t, url, 'slowpoke')
    const begun = performance.now()
    const cut = send(pace)
    // The other create waits in turn for the one upload connection, which the invited client holds.
    const other = await create(url, 'waiting')
    const waited = performance.now() - begun
    t.equal(other.status, 200, 'the waiting create gets the connection')
    t.match(other.body, { portfolio_id: /\S/ })
    // Far below the 60 s socket idle timeout that used to end the hold (and the 30 s UPSTREAM_TIMEOUT_MS it waits
    // within).
    t.ok(waited < 10_000, `it waited ${waited.toFixed(0)} ms for the invited client's bound`)
    const answer = await cut
    t.match(answer, /^HTTP\/1\.1 408 Request Timeout\r\n/, 'the invited client reads 408')
    t.match(answer, /\r\nconnection: close\r\n/i)
    t.same(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)), { error: message })
    t.equal(stub.requests.length, 1, "only the other create's reached the engine")
  })
}
