/**
 * Endpoint discovery that keeps up with a rollout (DECISIONS 24), against
 * stub engines on distinct loopback addresses (127.0.0.x, one port) behind one
 * name served by an injected lookup: a name is resolved again at once when an
 * endpoint becomes unreachable or none is left in rotation, one resolution in
 * flight at most; IPv4 is preferred; and an address that leaves the set takes
 * its metric series with it.
 */
import t, { type Test } from 'tap'
import { request } from 'undici'
import {
  contractHandler,
  json,
  startStubUpstream,
  type StubHandler,
  type StubUpstream
} from '../../fixtures/stub-upstream.js'
import type { Lookup } from '../../src/engine-client/endpoints.js'
import { bearer, build } from '../helpers/app.js'
import { freePort } from '../helpers/processes.js'
import { parseExposition } from '../helpers/prometheus.js'

const NAME = 'engine.test'

async function stubAt (
  t: Test,
  host: string,
  port: number,
  handler: StubHandler = contractHandler
): Promise<StubUpstream> {
  const s = await startStubUpstream(handler, { host, port })
  t.teardown(s.close)
  return s
}

/** A lookup the test changes, counting the lookups begun; while `gate` is set, a lookup waits for it. */
function dns (first: string[]): { lookup: Lookup; answer: string[]; calls: number; gate: Promise<void> | undefined } {
  const state = {
    answer: first,
    calls: 0,
    gate: undefined as Promise<void> | undefined,
    lookup: (async (name: string) => {
      if (name !== NAME) throw Object.assign(new Error(`unexpected name ${name}`), { code: 'ENOTFOUND' })
      state.calls++
      if (state.gate !== undefined) await state.gate
      return state.answer.map((address) => ({ address, family: address.includes(':') ? 6 : 4 }))
    }) as Lookup
  }
  return state
}

async function until (check: () => boolean, ms = 10_000): Promise<boolean> {
  const deadline = Date.now() + ms
  while (!check()) {
    if (Date.now() > deadline) return false
    await new Promise((resolve) => setTimeout(resolve, 5))
  }
  return true
}

async function ping (url: string): Promise<{ status: number; body: string }> {
  const res = await request(`${url}/api/portfolio/ping`, { headers: bearer() })
  return { status: res.statusCode, body: await res.body.text() }
}

const endpointsOf = (engine: { endpointStates: () => Array<{ endpoint: string }> }): string[] =>
  engine.endpointStates().map((e) => e.endpoint)

t.test('an endpoint that refuses a call has the name resolved again at once, not at the next refresh', async (t) => {
  const port = await freePort()
  const a = await stubAt(t, '127.0.0.1', port)
  // 127.0.0.2 has nothing listening on the port: the address of an engine that is gone.
  const names = dns(['127.0.0.1', '127.0.0.2'])
  // No refresh timer and no checks: only the refused connection can cause the second lookup.
  // Random 0.99: the first draw is the second endpoint (127.0.0.2), so the first ping tries it.
  const { url, engine } = await build(t, {
    upstreamUrl: `http://${NAME}:${port}`,
    cluster: { lookup: names.lookup, resolveIntervalMs: 0, health: { intervalMs: 0 }, random: () => 0.99 }
  })
  t.same(endpointsOf(engine), [`127.0.0.1:${port}`, `127.0.0.2:${port}`])
  t.equal(names.calls, 1, 'one lookup at start')
  const b = await stubAt(t, '127.0.0.3', port)
  names.answer = ['127.0.0.1', '127.0.0.3']
  t.same(await ping(url), { status: 200, body: 'pong' }, 'the refused try is retried on the other endpoint')
  t.ok(
    await until(() => endpointsOf(engine).includes(`127.0.0.3:${port}`)),
    'the new address is known without waiting for a refresh'
  )
  t.equal(names.calls, 2, 'exactly one more lookup')
  t.same(endpointsOf(engine), [`127.0.0.1:${port}`, `127.0.0.3:${port}`], 'the address that refused is gone')
  for (let i = 0; i < 10; i++) t.same(await ping(url), { status: 200, body: 'pong' })
  t.ok(
    b.requests.some((r) => r.url === '/api/portfolio/ping'),
    'the new address takes calls'
  )
  t.equal(a.requests.length + b.requests.length, 11)
})

t.test(
  'no endpoint left in rotation: the name is resolved again at once; one resolution in flight at most',
  async (t) => {
    const port = await freePort()
    const draining: StubHandler = (req, res, body) => {
      if (req.url === '/health') return json(res, 500, { status: 'error', message: 'shutting down' })
      contractHandler(req, res, body)
    }
    await stubAt(t, '127.0.0.2', port, draining)
    await stubAt(t, '127.0.0.3', port, draining)
    await stubAt(t, '127.0.0.4', port)
    const names = dns(['127.0.0.2', '127.0.0.3'])
    const { url, engine } = await build(t, {
      upstreamUrl: `http://${NAME}:${port}`,
      cluster: { lookup: names.lookup, resolveIntervalMs: 0, health: { intervalMs: 0 } }
    })
    t.equal(names.calls, 1)
    // The next lookup is held until the test lets it go: every trigger meanwhile joins it.
    let release: () => void = () => {}
    names.gate = new Promise<void>((resolve) => {
      release = resolve
    })
    names.answer = ['127.0.0.4']
    await engine.checkHealth()
    t.same(
      engine.endpointStates().map((e) => e.up),
      [false, false],
      'both drain: none in rotation'
    )
    t.equal(names.calls, 2, 'the name is asked again at once')
    await engine.checkHealth()
    await engine.checkHealth()
    t.equal(names.calls, 2, 'while it is in flight, no second lookup starts')
    release()
    t.ok(await until(() => endpointsOf(engine).join() === `127.0.0.4:${port}`), 'the new address replaces both')
    t.same(await ping(url), { status: 200, body: 'pong' })
  }
)

t.test(
  'a name with IPv4 and IPv6 addresses uses the IPv4 ones only (V4_PREFERRED); an IPv6-only name uses IPv6',
  async (t) => {
    const port = await freePort()
    const v4 = await stubAt(t, '127.0.0.1', port)
    const v6 = await stubAt(t, '::1', port)
    const names = dns(['::1', '127.0.0.1'])
    const { url, engine } = await build(t, {
      upstreamUrl: `http://${NAME}:${port}`,
      cluster: { lookup: names.lookup, resolveIntervalMs: 0, health: { intervalMs: 0 } }
    })
    t.same(endpointsOf(engine), [`127.0.0.1:${port}`], 'one endpoint for the dual-stack name')
    for (let i = 0; i < 5; i++) t.same(await ping(url), { status: 200, body: 'pong' })
    t.equal(v4.requests.length, 5)
    t.equal(v6.requests.length, 0, 'nothing over IPv6')
    names.answer = ['::1']
    await engine.resolve()
    t.same(endpointsOf(engine), [`[::1]:${port}`], 'IPv6 when the name has nothing else')
    t.same(await ping(url), { status: 200, body: 'pong' })
    t.equal(v6.requests.length, 1)
    t.equal(v6.requests[0]!.headers.host, `${NAME}:${port}`, 'the name is kept as Host')
  }
)

t.test('series: after the set turns over 5 times, /metrics holds no series for addresses that are gone', async (t) => {
  const port = await freePort()
  const sick: StubHandler = (req, res, body) => {
    if (req.url === '/api/portfolio/ping') {
      return json(res, 503, {
        success: false,
        error: { source: 'engine', code: 'UNAVAILABLE', message: 'overloaded', function: 'ping' }
      })
    }
    contractHandler(req, res, body)
  }
  const names = dns([])
  let generation = 0
  // Each generation: two new addresses, the first answers pings 503 (so it is ejected: an ejection series), the second
  // serves.
  async function next (): Promise<string[]> {
    const base = 10 + 2 * generation++
    const addresses = [`127.0.0.${base}`, `127.0.0.${base + 1}`]
    await stubAt(t, addresses[0]!, port, sick)
    await stubAt(t, addresses[1]!, port)
    names.answer = addresses
    return addresses
  }
  let current = await next()
  // Random 0: the first draw is the first address, so the sick one takes the first try of each ping.
  const { metrics, url, engine } = await build(t, {
    upstreamUrl: `http://${NAME}:${port}`,
    cluster: { lookup: names.lookup, resolveIntervalMs: 0, health: { intervalMs: 0 }, random: () => 0 }
  })
  const seen: string[] = []
  const labelled = (text: string, addresses: string[]): string[] =>
    parseExposition(text)
      .filter((s) => addresses.some((a) => Object.values(s.labels).includes(`${a}:${port}`)))
      .map((s) => `${s.name}{endpoint=${s.labels['endpoint'] ?? ''}}`)
  for (let turn = 0; turn <= 5; turn++) {
    for (let i = 0; i < 6; i++) t.same(await ping(url), { status: 200, body: 'pong' })
    const text = (await metrics.scrape()).body
    const mine = new Set(labelled(text, current))
    t.same(
      [...new Set([...mine].map((s) => s.replace(/\{.*/, '')))].sort(),
      ['gateway_engine_calls_total', 'gateway_engine_ejections_total', 'gateway_engine_endpoint_up'],
      `generation ${turn}: calls, ejection and up series for its addresses`
    )
    seen.push(...current)
    if (turn === 5) break
    current = await next()
    await engine.resolve()
    t.same(
      endpointsOf(engine),
      current.map((a) => `${a}:${port}`)
    )
  }
  const gone = seen.filter((a) => !current.includes(a))
  t.equal(gone.length, 10)
  // A removed endpoint's series go once its pool has closed (its calls are done): soon, not at once.
  let left: string[] = []
  const deadline = Date.now() + 10_000
  for (;;) {
    left = labelled((await metrics.scrape()).body, gone)
    if (left.length === 0 || Date.now() > deadline) break
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
  t.same(left, [], 'no series for the 10 addresses that left')
  t.equal(labelled((await metrics.scrape()).body, current).length > 0, true, 'the current ones are still there')
})

t.test(
  'a lookup that never answers counts as failed after its deadline: the next refresh applies the new answer',
  async (t) => {
    const port = await freePort()
    await stubAt(t, '127.0.0.2', port)
    await stubAt(t, '127.0.0.3', port)
    let answer = ['127.0.0.2']
    let calls = 0
    let hangNext = false
    const lookup: Lookup = async () => {
      calls++
      if (hangNext) {
        hangNext = false
        // A stuck resolver: this lookup never settles.
        return await new Promise<never>(() => {})
      }
      return answer.map((address) => ({ address, family: 4 }))
    }
    // A refresh every 200 ms: each lookup's deadline is the refresh period.
    const refreshMs = 200
    const { url, engine } = await build(t, {
      upstreamUrl: `http://${NAME}:${port}`,
      cluster: { lookup, resolveIntervalMs: refreshMs, health: { intervalMs: 0 } }
    })
    t.same(endpointsOf(engine), [`127.0.0.2:${port}`])
    hangNext = true
    const hungAt = calls + 1
    t.ok(await until(() => calls >= hungAt), 'the hanging lookup has begun')
    answer = ['127.0.0.3']
    const begun = Date.now()
    // Its deadline, then one refresh (and room for a busy machine; without the deadline it never happens).
    t.ok(
      await until(() => endpointsOf(engine).join() === `127.0.0.3:${port}`, refreshMs * 2 + 3_000),
      'the new address replaces the old one'
    )
    t.ok(calls > hungAt, 'lookups went on after the one that hung')
    t.ok(Date.now() - begun < refreshMs * 2 + 3_000)
    // resolve() does not wait for the hung lookup for ever either.
    await engine.resolve()
    t.same(await ping(url), { status: 200, body: 'pong' })
  }
)
