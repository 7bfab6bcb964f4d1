/**
 * Several engines as real processes (fixtures/draining-engine.ts, which drains
 * on SIGTERM as DECISIONS 25 says) behind one gateway, under a steady load of
 * ping, update and create: a rolling restart, a crash (SIGKILL) and a hang
 * (SIGSTOP) of one engine (DECISIONS 24).
 */
import { readFileSync } from 'node:fs'
import { once } from 'node:events'
import { join } from 'node:path'
import t, { type Test } from 'tap'
import { request } from 'undici'
import { PNG_IMAGE } from '../../fixtures/images.js'
import { bearer, build, validUpdate, type BuildOptions } from '../helpers/app.js'
import { multipartBody } from '../helpers/multipart.js'
import { ensureBuilt, freePort, ROOT, startProcess, type Proc } from '../helpers/processes.js'
import { parseExposition, valueOf } from '../helpers/prometheus.js'

ensureBuilt()
// Engine processes started, killed and restarted under load: minutes on a loaded 2-core runner.
t.setTimeout(300_000)
const ENGINE = join(ROOT, 'dist', 'fixtures', 'draining-engine.js')
const HEALTH_MS = 250

async function engine (t: Test, port: number, env: Record<string, string> = {}): Promise<Proc> {
  return await startProcess(
    t,
    ENGINE,
    { PORT: String(port), NOTICE_MS: String(4 * HEALTH_MS), DELAY_MS: '3', ...env },
    port,
    /listening/
  )
}

async function countsOf (url: string): Promise<Record<string, number>> {
  const res = await request(`${url}/_counts`)
  return (await res.body.json()) as Record<string, number>
}

async function until (check: () => boolean, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms
  while (!check()) {
    if (Date.now() > deadline) return false
    await new Promise((resolve) => setTimeout(resolve, 5))
  }
  return true
}

interface Outcome {
  kind: string
  start: number
  end: number
  status: number
}

const png = readFileSync(PNG_IMAGE)
const form = multipartBody([
  { name: 'name', value: 'Blue chips' },
  { name: 'type', value: 'PORTFOLIO' },
  { name: 'image', filename: 'a.png', contentType: 'image/png', data: png }
])

/** Workers that cycle ping, update, create until stopped; every answer recorded. */
function load (url: string, workers: number, kinds: readonly string[] = ['ping', 'update', 'create']) {
  const outcomes: Outcome[] = []
  const bodies: string[] = []
  let running = true
  const send = async (kind: string): Promise<number> => {
    const res =
      kind === 'ping'
        ? await request(`${url}/api/portfolio/ping`, { headers: bearer() })
        : kind === 'update'
          ? await request(`${url}/api/portfolio/update`, {
              method: 'POST',
              headers: { ...bearer(), 'content-type': 'application/json' },
              body: JSON.stringify(validUpdate())
            })
          : await request(`${url}/api/portfolio/create`, {
              method: 'POST',
              headers: { ...bearer(), 'content-type': form.contentType },
              body: form.body
            })
    const text = await res.body.text()
    if (res.statusCode !== 200) bodies.push(`${kind} ${res.statusCode} ${text}`)
    return res.statusCode
  }
  const done = Promise.all(
    Array.from({ length: workers }, async (_, w) => {
      for (let i = w; running; i++) {
        const kind = kinds[i % kinds.length]!
        const start = performance.now()
        let status: number
        try {
          status = await send(kind)
        } catch {
          status = 0
        }
        outcomes.push({ kind, start, end: performance.now(), status })
      }
    })
  )
  return {
    outcomes,
    bodies,
    stop: async () => {
      running = false
      await done
    }
  }
}

const failed = (outcomes: Outcome[]): Outcome[] => outcomes.filter((o) => o.status !== 200)
// One user sends every create of the load: not a test of the per-user upload cap (DECISIONS 23).
const GATEWAY: BuildOptions = {
  env: { RATE_LIMIT_PER_MINUTE: '0', UPSTREAM_TIMEOUT_MS: '3000', UPLOAD_MAX_PER_USER: '1000' }
}

t.test('rolling restart: each engine drains (SIGTERM), restarts and rejoins; no client request fails', async (t) => {
  const ports = [await freePort(), await freePort()]
  const engines = [await engine(t, ports[0]!), await engine(t, ports[1]!)]
  const { url, engine: client } = await build(t, {
    ...GATEWAY,
    upstreamUrls: engines.map((e) => e.url),
    cluster: { health: { intervalMs: HEALTH_MS } }
  })
  const traffic = load(url, 6)
  await until(() => traffic.outcomes.length >= 30, 30_000)
  for (const i of [0, 1]) {
    const old = engines[i]!
    const exited = once(old.proc, 'exit')
    old.proc.kill('SIGTERM')
    await old.waitFor(/draining/)
    await exited
    const during = traffic.outcomes.length
    engines[i] = await engine(t, ports[i]!)
    t.ok(await until(() => client.endpointStates()[i]!.up, 10_000), `engine ${i} back in rotation`)
    t.ok(await until(() => traffic.outcomes.length >= during + 20, 30_000), 'traffic went on')
    const counts = await countsOf(engines[i]!.url)
    t.ok((counts['GET /health'] ?? 0) >= 2, 'rejoined after its health checks')
  }
  await traffic.stop()
  const kinds = new Set(traffic.outcomes.map((o) => o.kind))
  t.same([...kinds].sort(), ['create', 'ping', 'update'])
  t.same(failed(traffic.outcomes), [], `0 failed of ${traffic.outcomes.length} client requests`)
})

t.test(
  'crash: SIGKILL one engine mid-load; only calls in flight on it may fail, later ones succeed; it rejoins within 2 checks',
  async (t) => {
    const CHECK_MS = 500
    const ports = [await freePort(), await freePort()]
    const engines = [await engine(t, ports[0]!, { DELAY_MS: '20' }), await engine(t, ports[1]!, { DELAY_MS: '20' })]
    const {
      metrics,
      url,
      engine: client
    } = await build(t, {
      ...GATEWAY,
      upstreamUrls: engines.map((e) => e.url),
      cluster: { health: { intervalMs: CHECK_MS } }
    })
    const traffic = load(url, 8)
    await until(() => traffic.outcomes.length >= 40, 30_000)
    const a = engines[0]!
    const exited = once(a.proc, 'exit')
    const killedAt = performance.now()
    a.proc.kill('SIGKILL')
    await exited
    // The kernel has closed A's sockets; "after the kill" starts once the gateway has read every one of
    // those closes (a request written into a socket it has not yet seen close is one in flight at the kill).
    t.ok(
      await until(() => client.connectionsOf(`127.0.0.1:${ports[0]}`) === 0, 10_000),
      "the gateway has seen A's connections close"
    )
    const afterKill = performance.now()
    await until(() => traffic.outcomes.filter((o) => o.start > afterKill).length >= 60, 30_000)

    const inFlightAtKill = traffic.outcomes.filter((o) => o.start < killedAt && o.end > killedAt)
    const failures = failed(traffic.outcomes)
    t.ok(
      failures.every((o) => o.start < afterKill),
      `every request sent after the kill succeeded (failures, ms from the kill: ${JSON.stringify(failures.map((o) => ({ ...o, start: Math.round(o.start - killedAt), end: Math.round(o.end - killedAt) })))})`
    )
    t.ok(
      failures.every((o) => o.status === 502 || o.status === 504),
      `failures are 502 or 504: ${JSON.stringify(failures.map((o) => o.status))}`
    )
    t.ok(
      failures.length <= inFlightAtKill.length,
      `${failures.length} failed, ${inFlightAtKill.length} were in flight at the kill; ${traffic.bodies.join('; ')}`
    )

    // Out of rotation by its failed checks, or by ejection when its failures came 5 in a row.
    t.ok(await until(() => !client.endpointStates()[0]!.up, 10 * CHECK_MS), 'A out of rotation')
    const restarted = await engine(t, ports[0]!, { DELAY_MS: '20' })
    engines[0] = restarted
    const back = performance.now()
    t.ok(await until(() => client.endpointStates()[0]!.up, 10 * CHECK_MS), 'A back in rotation')
    const took = performance.now() - back
    const checks = (await countsOf(restarted.url))['GET /health'] ?? 0
    // The count of checks shows it rejoined at its second passing check; the time only that nothing else held it
    // back: as many intervals as checks, and a second for a loaded machine (CI saw 1,031 ms against 1,400 before).
    t.ok(
      checks <= 3 && took < 3 * CHECK_MS + 1_000,
      `back after ${checks} checks (the second passing one puts it back), ${took.toFixed(0)} ms`
    )
    const before = (await countsOf(restarted.url))['GET /api/portfolio/ping'] ?? 0
    const sent = traffic.outcomes.length
    await until(() => traffic.outcomes.length >= sent + 30, 30_000)
    await traffic.stop()
    t.ok(((await countsOf(restarted.url))['GET /api/portfolio/ping'] ?? 0) > before, 'A takes calls again')
    const samples = parseExposition((await metrics.scrape()).body)
    // Passed over from its first refusal, A may never fail 5 calls in a row: ejected once at most.
    t.ok(
      (valueOf(samples, 'gateway_engine_ejections_total', { endpoint: `127.0.0.1:${ports[0]}` }) ?? 0) <= 1,
      'A was ejected once at most'
    )
  }
)

t.test(
  'hang: SIGSTOP one engine; ejected after its 5th timeout, GETs retried within their try timeout, p99 back; SIGCONT brings it back',
  async (t) => {
    const ports = [await freePort(), await freePort()]
    const engines = [await engine(t, ports[0]!), await engine(t, ports[1]!)]
    // Random fixed at 0: with nothing in flight the first endpoint (A) is always drawn first, so every
    // sequential ping tries A, and A's timeouts are consecutive and counted exactly.
    const {
      metrics,
      url,
      engine: client
    } = await build(t, {
      env: { RATE_LIMIT_PER_MINUTE: '0', UPSTREAM_TIMEOUT_MS: '1500' },
      upstreamUrls: engines.map((e) => e.url),
      cluster: { random: () => 0, health: { intervalMs: 2_000 } }
    })
    const ping = async (): Promise<{ status: number; ms: number }> => {
      const start = performance.now()
      const res = await request(`${url}/api/portfolio/ping`, { headers: bearer() })
      await res.body.dump()
      return { status: res.statusCode, ms: performance.now() - start }
    }
    const p99 = (xs: number[]): number => xs.sort((x, y) => x - y)[Math.floor(xs.length * 0.99)]!
    const baseline: number[] = []
    for (let i = 0; i < 200; i++) baseline.push((await ping()).ms)

    const a = engines[0]!
    a.proc.kill('SIGSTOP')
    t.teardown(() => {
      a.proc.kill('SIGCONT')
    })
    const stoppedAt = performance.now()
    const slow: number[] = []
    let ejectedAt = 0
    for (let i = 0; i < 20 && ejectedAt === 0; i++) {
      const { status, ms } = await ping()
      t.equal(status, 200, 'retried onto B')
      slow.push(ms)
      if (!client.endpointStates()[0]!.up) ejectedAt = performance.now()
    }
    t.ok(ejectedAt > 0, 'A ejected')
    const samples = parseExposition((await metrics.scrape()).body)
    t.equal(valueOf(samples, 'gateway_engine_ejections_total', { endpoint: `127.0.0.1:${ports[0]}` }), 1)
    t.equal(
      valueOf(samples, 'gateway_engine_retries_total', { call: 'ping', reason: 'try_timeout' }),
      5,
      'ejected after its 5th timeout'
    )
    t.equal(slow.length, 5, 'five pings met the hung engine')
    t.ok(
      slow.every((ms) => ms >= 490 && ms < 1_500),
      `each answered after one 500 ms try timeout, within the 1500 ms deadline: ${slow.map((ms) => ms.toFixed(0)).join(', ')}`
    )

    const after: number[] = []
    for (let i = 0; i < 200; i++) {
      const { status, ms } = await ping()
      if (status !== 200) t.fail(`ping ${i}: ${status}`)
      after.push(ms)
    }
    const recovered = performance.now() - stoppedAt
    const [before, now] = [p99(baseline), p99(after)]
    t.ok(
      now < Math.max(50, 1.5 * before),
      `p99 ${now.toFixed(1)} ms after the ejection (${before.toFixed(1)} ms before the hang)`
    )
    t.ok(recovered < 15_000, `ping p99 back within ${(recovered / 1000).toFixed(1)} s of the hang`)

    a.proc.kill('SIGCONT')
    t.ok(await until(() => client.endpointStates()[0]!.up, 10_000), 'SIGCONT: A back in rotation')
    const served = (await countsOf(a.url))['GET /api/portfolio/ping'] ?? 0
    for (let i = 0; i < 10; i++) t.equal((await ping()).status, 200)
    t.ok(((await countsOf(a.url))['GET /api/portfolio/ping'] ?? 0) > served, 'A takes calls again')
  }
)
