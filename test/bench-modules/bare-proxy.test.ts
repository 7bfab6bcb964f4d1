/**
 * The cost table's floor (bench/bare-proxy.ts, DECISIONS 30) must stay an
 * honest proxy, on node:http and on Fastify alike: it refuses a missing,
 * forged or expired token with 401 before the engine hears of it, tells the
 * engine who the caller is, streams a body on, copies the engine's status,
 * content type and bytes back, and answers 502 when the engine cannot be
 * reached or fails mid-answer. Over real sockets against a stub engine.
 */
import type { Server } from 'node:http'
import t, { type Test } from 'tap'
import { createBareFastify, createBareProxy } from '../../bench/bare-proxy.js'
import { mintToken, randomSecret } from '../../bench/payloads.js'
import { startBareProxy } from '../../bench/processes.js'
import { faults, json, refusedPort, startStubUpstream, type StubUpstream } from '../../fixtures/stub-upstream.js'
import { listenOnLoopback } from '../helpers/processes.js'

const PING = '/api/portfolio/ping'
const UPDATE = '/api/portfolio/update'
const SECRET = randomSecret()

const variants: Array<[string, (upstream: string, secret: string) => Server | Promise<Server>]> = [
  ['node:http', createBareProxy],
  ['Fastify', createBareFastify]
]

async function proxyTo (
  t: Test,
  upstream: string,
  create: (upstream: string, secret: string) => Server | Promise<Server>
): Promise<string> {
  const port = await listenOnLoopback(t, await create(upstream, SECRET))
  return `http://127.0.0.1:${port}`
}

async function stub (t: Test): Promise<StubUpstream> {
  const engine = await startStubUpstream()
  t.teardown(async () => await engine.close())
  return engine
}

async function call (
  url: string,
  init: RequestInit = {}
): Promise<{ status: number; type: string | null; body: string }> {
  const res = await fetch(url, { ...init, signal: AbortSignal.timeout(10_000) })
  return { status: res.status, type: res.headers.get('content-type'), body: await res.text() }
}

const bearer = (token: string): Record<string, string> => ({ authorization: `Bearer ${token}` })

for (const [name, create] of variants) {
  t.test(
    `${name}: a valid token's ping reaches the engine as the caller, and the answer comes back as it was`,
    async (t) => {
      const engine = await stub(t)
      const proxy = await proxyTo(t, engine.url, create)
      t.same(await call(proxy + PING, { headers: bearer(mintToken(SECRET, 'user-alice')) }), {
        status: 200,
        type: 'text/plain; charset=utf-8',
        body: 'pong'
      })
      t.equal(engine.requests.length, 1)
      t.equal(engine.requests[0]!.headers['x-user-id'], 'user-alice', 'the engine is told who the caller is')
      t.equal(engine.requests[0]!.headers.authorization, undefined, 'the token itself is not passed on')
    }
  )

  t.test(`${name}: a missing, forged or expired token is 401 and never reaches the engine`, async (t) => {
    const engine = await stub(t)
    const proxy = await proxyTo(t, engine.url, create)
    const refused = { status: 401, type: 'application/json', body: '{"error":"unauthorized"}' }
    t.same(await call(proxy + PING), refused, 'missing')
    t.same(
      await call(proxy + PING, { headers: bearer(mintToken(randomSecret(), 'user-alice')) }),
      refused,
      'signed with another secret'
    )
    t.same(
      await call(proxy + PING, { headers: bearer(mintToken(SECRET, 'user-alice', -60)) }),
      refused,
      'expired a minute ago'
    )
    t.equal(engine.requests.length, 0)
  })

  t.test(
    `${name}: an update's body is streamed on byte for byte and the engine's error status is copied back`,
    async (t) => {
      const engine = await stub(t)
      engine.handle((_req, res) => {
        json(res, 404, { success: false, error: 'no such portfolio' })
      })
      const proxy = await proxyTo(t, engine.url, create)
      const body = JSON.stringify({ portfolio_id: 'p-1', positions: [{ mint: 'x', weight: 1 }] })
      const answer = await call(proxy + UPDATE, {
        method: 'POST',
        headers: { ...bearer(mintToken(SECRET, 'user-bob')), 'content-type': 'application/json' },
        body
      })
      t.same(answer, {
        status: 404,
        type: 'application/json; charset=utf-8',
        body: '{"success":false,"error":"no such portfolio"}'
      })
      t.equal(engine.requests[0]!.body.toString(), body)
      t.equal(engine.requests[0]!.headers['content-type'], 'application/json')
      t.equal(engine.requests[0]!.headers['content-length'], String(Buffer.byteLength(body)))
      t.equal(engine.requests[0]!.headers['x-user-id'], 'user-bob')
    }
  )

  t.test(`${name}: an engine that refuses connections or resets mid-request is 502`, async (t) => {
    const badGateway = { status: 502, type: 'application/json', body: '{"error":"bad gateway"}' }
    const token = bearer(mintToken(SECRET))
    const refusing = await proxyTo(t, `http://127.0.0.1:${await refusedPort()}`, create)
    t.same(await call(refusing + PING, { headers: token }), badGateway, 'connection refused')
    const engine = await stub(t)
    engine.handle(faults.reset)
    const resetting = await proxyTo(t, engine.url, create)
    t.same(await call(resetting + PING, { headers: token }), badGateway, 'reset')
  })
}

// The harness's secrets are random base64url: one in 64 begins with '-', which an option parser
// takes for another option unless the value is joined to its name (--secret=...).
t.test('the harness starts the bare proxy process with a secret that begins with a dash', async (t) => {
  const engine = await stub(t)
  const secret = `-${randomSecret()}`
  for (const fastify of [false, true]) {
    const proxy = await startBareProxy(engine.url, secret, [], fastify)
    t.teardown(async () => await proxy.stop())
    t.same(
      await call(proxy.url + PING, { headers: bearer(mintToken(secret, 'user-alice')) }),
      { status: 200, type: 'text/plain; charset=utf-8', body: 'pong' },
      fastify ? 'on Fastify' : 'on node:http'
    )
  }
})
