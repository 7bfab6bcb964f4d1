/**
 * Active health checks that tell the truth (DECISIONS 24): on connections
 * of their own, never queued behind requests; one deadline for connect and
 * answer; a 200 whose services are not all `connected` fails; checks go on
 * for a single endpoint; and the ejection multiplier decays while the endpoint
 * stays in rotation (Envoy's outlier detection).
 */
import { spawn } from 'node:child_process'
import { connect, type Socket } from 'node:net'
import { once } from 'node:events'
import { createServer, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import t, { type Test } from 'tap'
import { Pool, request } from 'undici'
import {
  contractHandler,
  json,
  startStubUpstream,
  type StubHandler,
  type StubUpstream
} from '../../fixtures/stub-upstream.js'
import { EndpointSet } from '../../src/engine-client/endpoints.js'
import { HealthState } from '../../src/engine-client/health.js'
import { bearer, build } from '../helpers/app.js'
import { newImageDir } from '../helpers/engine-process.js'
import { ENGINE_SCRIPT, ensureBuilt, freePort, startProcess, type Proc } from '../helpers/processes.js'

ensureBuilt()

const CONNECTED = { status: 'ok', services: { database: 'connected', cache: 'connected' } }

async function stub (t: Test, handler: StubHandler = contractHandler): Promise<StubUpstream> {
  const s = await startStubUpstream(handler)
  t.teardown(s.close)
  return s
}

async function until (check: () => boolean, ms = 15_000): Promise<boolean> {
  const deadline = Date.now() + ms
  while (!check()) {
    if (Date.now() > deadline) return false
    await new Promise((resolve) => setTimeout(resolve, 5))
  }
  return true
}

async function timed (fn: () => Promise<unknown>): Promise<number> {
  const started = performance.now()
  await fn()
  return performance.now() - started
}

async function apiHealth (url: string): Promise<unknown> {
  const res = await request(`${url}/api/health`, { headers: bearer() })
  const body = (await res.body.json()) as { status: string; services: unknown }
  return { status: res.statusCode, body: { status: body.status, services: body.services } }
}

const ups = (engine: { endpointStates: () => Array<{ up: boolean }> }): boolean[] =>
  engine.endpointStates().map((e) => e.up)

t.test(
  'checks use connections of their own: with every request connection held, a check still answers within its timeout',
  async (t) => {
    let health: unknown = { status: 'degraded', services: { database: 'disconnected', cache: 'connected' } }
    const held: ServerResponse[] = []
    const s = await stub(t, (req, res, body) => {
      if (req.url === '/health') return json(res, 200, health)
      if (req.url === '/api/portfolio/ping') {
        held.push(res)
        return
      }
      contractHandler(req, res, body)
    })
    t.teardown(() => {
      for (const res of held) if (!res.writableEnded) res.end()
    })
    // Two request connections and a long call deadline: six pings fill both and queue four behind them.
    const { url, engine } = await build(t, {
      upstreamUrl: s.url,
      pool: { connections: 2 },
      env: { UPSTREAM_TIMEOUT_MS: '20000' },
      cluster: { health: { intervalMs: 0 } }
    })
    await engine.checkHealth()
    await engine.checkHealth()
    t.same(ups(engine), [false], 'two failed checks: out of rotation (a single endpoint is checked too)')
    const pings = Array.from(
      { length: 6 },
      async () => await request(`${url}/api/portfolio/ping`, { headers: bearer() })
    )
    t.ok(
      await until(() => held.length === 2 && engine.poolState().queued === 4),
      'both request connections busy, four calls queued'
    )
    health = CONNECTED
    const took = [
      await timed(async () => {
        await engine.checkHealth()
      }),
      await timed(async () => {
        await engine.checkHealth()
      })
    ]
    t.same(ups(engine), [true], 'two passing checks while the pool is saturated: back in rotation')
    t.ok(
      took.every((ms) => ms < 1000),
      `each check answered within its 1 s timeout: ${took.map((ms) => ms.toFixed(0)).join(', ')} ms`
    )
    t.equal(engine.poolState().queued, 4, 'the checks did not take a place in the request queue')
    for (const res of held) res.end('pong')
    s.handle(contractHandler)
    for (const res of await Promise.all(pings)) await res.body.dump()
  }
)

t.test(
  'one deadline covers connect and answer: a check against a connect that hangs, or an engine that never answers, fails within 1 s',
  async (t) => {
    // A listener whose accept queue (backlog 0) holds one connection that is never accepted: the next SYN is
    // dropped, so a connect hangs.
    const py = spawn(
      'python3',
      [
        '-c',
        'import socket,time\ns=socket.socket(); s.bind(("127.0.0.1",0)); s.listen(0)\nprint(s.getsockname()[1], flush=True)\ntime.sleep(120)'
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] }
    )
    t.teardown(() => {
      py.kill('SIGKILL')
    })
    const [line] = (await once(py.stdout!, 'data')) as [Buffer]
    const port = Number(line.toString().trim())
    const filler: Socket = connect(port, '127.0.0.1')
    t.teardown(() => {
      filler.destroy()
    })
    await once(filler, 'connect')
    const silent = await stub(t, (req, res, body) => {
      if (req.url !== '/health') contractHandler(req, res, body)
    })
    const { engine } = await build(t, {
      upstreamUrls: [`http://127.0.0.1:${port}`, silent.url],
      cluster: { health: { intervalMs: 0 } }
    })
    const took = [
      await timed(async () => {
        await engine.checkHealth()
      }),
      await timed(async () => {
        await engine.checkHealth()
      })
    ]
    t.same(ups(engine), [false, false], 'both fail their checks')
    // The old check waited for the pool's 2 s connect timeout before its own 1 s began.
    t.ok(
      took.every((ms) => ms >= 950 && ms < 1900),
      `each round (both checks at once) took the 1 s deadline, not the old 2 s connect timeout and more: ${took.map((ms) => ms.toFixed(0)).join(', ')} ms`
    )
    t.equal(silent.stats.started, 2, 'the silent engine got both checks')
  }
)

t.test("an engine whose /health answers 200 with a service not 'connected' fails its checks", async (t) => {
  const sick = await stub(t, (req, res, body) => {
    if (req.url === '/health') { return json(res, 200, { status: 'degraded', services: { database: 'connected', cache: 'disconnected' } }) }
    contractHandler(req, res, body)
  })
  const good = await stub(t)
  const { url, engine } = await build(t, { upstreamUrls: [sick.url, good.url], cluster: { health: { intervalMs: 0 } } })
  await engine.checkHealth()
  t.same(ups(engine), [true, true], 'one failure is not enough')
  await engine.checkHealth()
  t.same(ups(engine), [false, true], 'two in a row: out of rotation')
  t.same(
    await apiHealth(url),
    { status: 200, body: { status: 'degraded', services: { database: 'connected', cache: 'connected' } } },
    'degraded, with services from the healthy one'
  )
  const before = sick.requests.length
  for (let i = 0; i < 10; i++) {
    const res = await request(`${url}/api/portfolio/ping`, { headers: bearer() })
    t.equal(res.statusCode, 200)
    await res.body.dump()
  }
  t.equal(sick.requests.length, before, 'no call reaches it')
  sick.handle(contractHandler)
  await engine.checkHealth()
  await engine.checkHealth()
  t.same(ups(engine), [true, true], 'connected again: back after two checks')
  t.same(await apiHealth(url), {
    status: 200,
    body: { status: 'ok', services: { database: 'connected', cache: 'connected' } }
  })
})

t.test('the ejection multiplier goes up per ejection and down by one per base ejection time in rotation', async (t) => {
  const BASE = 1500
  // Pools that are never used: ejection is driven by failures reported here, as call.ts reports them.
  const set = new EndpointSet({
    urls: ['http://127.0.0.1:1', 'http://127.0.0.1:2'],
    pool: (origin) => new Pool(origin)
  })
  const health = new HealthState(set, { intervalMs: 0, ejectionBaseMs: BASE })
  t.teardown(async () => {
    health.close()
    await set.close()
  })
  const e = set.list[0]!
  const eject = (): number => {
    const at = Date.now()
    for (let i = 0; i < 5; i++) health.failed(e)
    t.ok(e.ejected, 'ejected after 5 failures')
    return Math.round((e.ejectedUntil - at) / BASE)
  }
  t.equal(eject(), 1, 'first ejection: 1 x base')
  t.ok(await until(() => !e.ejected), 'back after it')
  t.equal(eject(), 2, 'ejected again at once: 2 x base')
  t.ok(await until(() => !e.ejected), 'back after it')
  await new Promise((resolve) => setTimeout(resolve, 2 * BASE + 100))
  t.ok(e.up, 'two base times and a little in rotation')
  t.equal(eject(), 1, 'the multiplier decayed by two: 1 x base again (without decay it would be 3)')
  t.equal(e.ejections, 3, 'the ejection count itself does not decay')
})

/** The reference engine as a process on `host`:`port` (several share one port on distinct loopback addresses). */
async function referenceEngine (t: Test, host: string, port: number, imageDir: string): Promise<Proc> {
  return await startProcess(
    t,
    ENGINE_SCRIPT,
    { NODE_ENV: 'test', ENGINE_PORT: String(port), ENGINE_HOST: host, ENGINE_IMAGE_DIR: imageDir },
    port,
    /portfolio engine ready/
  )
}

t.test(
  'a single survivor: stopped until marked down, left alone in the set, resumed: /api/health says ok within 3 checks',
  async (t) => {
    const HEALTH_MS = 300
    const port = await freePort()
    const dir = newImageDir(t)
    const x = await referenceEngine(t, '127.0.0.2', port, dir)
    await referenceEngine(t, '127.0.0.3', port, dir)
    let answer = ['127.0.0.2', '127.0.0.3']
    const lookup = async () => answer.map((address) => ({ address, family: 4 }))
    const { url, engine } = await build(t, {
      upstreamUrl: `http://engine.test:${port}`,
      cluster: { lookup, resolveIntervalMs: 0, health: { intervalMs: HEALTH_MS, timeoutMs: 250 } }
    })
    t.same(ups(engine), [true, true])
    x.proc.kill('SIGSTOP')
    t.teardown(() => {
      x.proc.kill('SIGCONT')
    })
    t.ok(await until(() => !engine.endpointStates()[0]!.up), 'the stopped engine is marked down by its checks')
    answer = ['127.0.0.2']
    await engine.resolve()
    t.same(
      engine.endpointStates(),
      [{ endpoint: `127.0.0.2:${port}`, up: false }],
      'the set shrinks to the one that is down'
    )
    x.proc.kill('SIGCONT')
    const resumed = performance.now()
    t.ok(await until(() => !engine.degraded(), 3 * HEALTH_MS + 2_000), 'back in rotation')
    const took = performance.now() - resumed
    const body = await apiHealth(url)
    t.same(body, { status: 200, body: { status: 'ok', services: { database: 'connected', cache: 'connected' } } })
    // Two passing checks put it back: within 3 check intervals (the round the resume fell into may wait for its
    // timeout).
    t.ok(
      took < 3 * HEALTH_MS + 250 + 1000,
      `ok ${took.toFixed(0)} ms after the resume (3 checks: ${3 * HEALTH_MS} ms, plus a check's timeout and 1 s for a loaded machine)`
    )
  }
)

t.test(
  'the check connection idles at most 4 s, under the idle timeouts engines commonly use (Node: 5 s), even with a 10 s check interval',
  async (t) => {
    // An engine that would keep the socket a minute: only the checker's own bound closes it.
    const server = createServer((req, res) => {
      contractHandler(req, res, Buffer.alloc(0))
    })
    server.keepAliveTimeout = 60_000
    const closed: number[] = []
    server.on('connection', (socket) => {
      socket.on('close', () => {
        closed.push(performance.now())
      })
    })
    server.listen(0, '127.0.0.1')
    await once(server, 'listening')
    t.teardown(() => {
      server.closeAllConnections()
      server.close()
    })
    const { port } = server.address() as AddressInfo
    const { engine } = await build(t, {
      upstreamUrl: `http://127.0.0.1:${port}`,
      cluster: { health: { intervalMs: 10_000 } }
    })
    await engine.checkHealth()
    const checkedAt = performance.now()
    t.same(ups(engine), [true])
    t.ok(await until(() => closed.length > 0, 6_000), 'the check connection closed while idle, before the next check')
    t.ok(closed[0]! - checkedAt < 5_000, `closed ${(closed[0]! - checkedAt).toFixed(0)} ms after the check`)
  }
)
