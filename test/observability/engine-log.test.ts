/**
 * The engine cluster in the log: an endpoint out of rotation and back, the
 * set changing with DNS, a name's lookup failing (once per run of failures,
 * counted in gateway_engine_dns_failures_total) and answering again. Changes
 * only: nothing is logged per request.
 */
import { Writable } from 'node:stream'
import Fastify from 'fastify'
import t from 'tap'
import { request } from 'undici'
import { startDnsServer } from '../../deploy/local/dns.js'
import { waitUntil } from '../../deploy/local/parts.js'
import { contractHandler, json, startStubUpstream, type StubHandler } from '../../fixtures/stub-upstream.js'
import { EngineClient } from '../../src/engine-client/client.js'
import { serversLookup } from '../../src/engine-client/endpoints.js'
import { LOOKUP_WARNING_EVERY_MS, logEngineEvents } from '../../src/observability/engine-log.js'
import type { ClusterObserver } from '../../src/observability/metrics.js'
import { bearer, build, SECRET } from '../helpers/app.js'
import { gatewayUrl, lines, SERVER, start } from '../helpers/gateway-process.js'
import { ensureBuilt, freePort } from '../helpers/processes.js'
import { parseExposition, valueOf } from '../helpers/prometheus.js'

interface Line {
  level: number
  msg: string
  [key: string]: unknown
}

const ENGINE_LINES = /^engine /

t.test(
  'an endpoint ejected is one warning with its state; its return one info line; the pings in between log nothing',
  async (t) => {
    let failing = true
    const sick: StubHandler = (req, res, body) => {
      if (failing && req.url === '/api/portfolio/ping') {
        json(res, 503, {
          success: false,
          error: { source: 'engine', code: 'UNAVAILABLE', message: 'overloaded', function: 'ping' }
        })
      } else contractHandler(req, res, body)
    }
    const a = await startStubUpstream(sick)
    t.teardown(a.close)
    const b = await startStubUpstream()
    t.teardown(b.close)
    const logged: Line[] = []
    const stream = new Writable({
      write (chunk: Buffer, _enc, done) {
        for (const l of lines(chunk.toString())) logged.push(JSON.parse(l) as Line)
        done()
      }
    })
    const { url } = await build(t, {
      upstreamUrls: [a.url, b.url],
      logger: { level: 'info', stream },
      // Ejection for 300 ms; checks every 100 ms end it once the engine is well. A check may take 5 s on a
      // loaded runner: a slow check must not read as the engine leaving rotation (a second warning).
      cluster: { health: { intervalMs: 100, timeoutMs: 5_000, ejectionBaseMs: 300 }, random: () => 0 }
    })
    // Pings until the sick engine is ejected (its fifth failure), and not one more: its /health passes, so a
    // check may end the ejection early, and a ping after that would fail on it again and eject it twice.
    const ejected = (): boolean => logged.some((l) => l.msg === 'engine endpoint out of rotation')
    const statuses: number[] = []
    for (let i = 0; i < 20 && !ejected(); i++) {
      const res = await request(`${url}/api/portfolio/ping`, { headers: bearer() })
      statuses.push(res.statusCode)
      await res.body.dump()
    }
    t.ok(ejected(), 'ejected within 20 pings')
    t.same([...new Set(statuses)], [200], 'every ping answered (a failure retried on the other engine)')
    const sickKey = `127.0.0.1:${a.port}`
    failing = false
    await waitUntil(
      'the return in the log',
      async () => logged.some((l) => l.msg === 'engine endpoint back in rotation'),
      5_000
    )
    t.same(
      logged.filter((l) => ENGINE_LINES.test(l.msg)).map((l) => [l.level, l.msg, l['endpoint'], l['state']]),
      [
        [40, 'engine endpoint out of rotation', sickKey, 'ejected'],
        [30, 'engine endpoint back in rotation', sickKey, undefined]
      ],
      'one line when it left, one when it came back, and no other engine line'
    )
  }
)

t.test(
  'a gateway process: the set changing with DNS is one info line; a failing name one warning per run of failures, counted; its return one info line',
  async (t) => {
    ensureBuilt()
    const dns = await startDnsServer()
    t.teardown(dns.close)
    const port = await freePort()
    for (const host of ['127.0.0.2', '127.0.0.3']) {
      const s = await startStubUpstream(contractHandler, { host, port })
      t.teardown(s.close)
    }
    const name = 'engines.test'
    dns.set(name, ['127.0.0.2'])
    const metricsPort = await freePort()
    const child = start(t, SERVER, {
      PORT: '0',
      LOG_LEVEL: 'info',
      JWT_SECRET: SECRET,
      METRICS_PORT: String(metricsPort),
      UPSTREAM_URL: `http://${name}:${port}`,
      UPSTREAM_DNS_SERVERS: dns.address,
      UPSTREAM_DNS_REFRESH_MS: '200'
    })
    await gatewayUrl(child)
    const engineLines = (): Line[] =>
      lines(child.out())
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as Line)
        .filter((l) => ENGINE_LINES.test(l.msg))
    const failures = async (): Promise<number> => {
      const res = await request(`http://127.0.0.1:${metricsPort}/metrics`)
      return valueOf(parseExposition(await res.body.text()), 'gateway_engine_dns_failures_total', { name }) ?? 0
    }

    dns.set(name, ['127.0.0.2', '127.0.0.3'])
    await waitUntil(
      'the change in the log',
      async () => engineLines().some((l) => l.msg === 'engine endpoints changed (DNS)'),
      10_000
    )

    dns.remove(name)
    const asked = dns.queries(name)
    await waitUntil(
      'the failure in the log',
      async () => engineLines().some((l) => l.msg.startsWith('engine name lookup failed')),
      10_000
    )
    // Three more failed refreshes: still one warning, and each one counted.
    await waitUntil('three more lookups', async () => dns.queries(name) >= asked + 4, 10_000)
    await waitUntil('the failures counted', async () => (await failures()) >= 3, 10_000)

    dns.set(name, ['127.0.0.3'])
    await waitUntil(
      'the return in the log',
      async () => engineLines().some((l) => l.msg === 'engine name resolves again'),
      10_000
    )
    await waitUntil(
      'the set following the name',
      async () => engineLines().filter((l) => l.msg === 'engine endpoints changed (DNS)').length === 2,
      10_000
    )

    t.same(
      engineLines().map((l) => [l.level, l.msg, l['name'], l['reason'], l['endpoints']]),
      [
        [30, 'engine endpoints changed (DNS)', undefined, undefined, [`127.0.0.2:${port}`, `127.0.0.3:${port}`]],
        [
          40,
          'engine name lookup failed: its endpoints are kept as they were, and it is asked again at the next refresh',
          name,
          'ENOTFOUND',
          undefined
        ],
        [30, 'engine name resolves again', name, undefined, undefined],
        [30, 'engine endpoints changed (DNS)', undefined, undefined, [`127.0.0.3:${port}`]]
      ],
      'each change once, in order'
    )
  }
)

t.test(
  'a name that fails at start is logged and counted as soon as the gateway listens, not at the next refresh',
  async (t) => {
    ensureBuilt()
    const dns = await startDnsServer()
    t.teardown(dns.close)
    const metricsPort = await freePort()
    const name = 'unknown.test'
    const child = start(t, SERVER, {
      PORT: '0',
      LOG_LEVEL: 'info',
      JWT_SECRET: SECRET,
      METRICS_PORT: String(metricsPort),
      UPSTREAM_URL: `http://${name}:4000`,
      UPSTREAM_DNS_SERVERS: dns.address,
      // No refresh within the test: only the lookup at start can be told.
      UPSTREAM_DNS_REFRESH_MS: '3600000'
    })
    await gatewayUrl(child)
    const engineLines = lines(child.out())
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Line)
      .filter((l) => ENGINE_LINES.test(l.msg))
    t.same(
      engineLines.map((l) => [l.level, l.msg, l['name'], l['reason'], l['failures']]),
      [
        [
          40,
          'engine name lookup failed: its endpoints are kept as they were, and it is asked again at the next refresh',
          name,
          'ENOTFOUND',
          1
        ]
      ],
      'the start-up failure, before the gateway listens'
    )
    const res = await request(`http://127.0.0.1:${metricsPort}/metrics`)
    t.equal(
      valueOf(parseExposition(await res.body.text()), 'gateway_engine_dns_failures_total', { name }),
      1,
      'and counted'
    )
    t.equal(dns.queries(name), 1, 'one lookup made')
  }
)

/** An engine client's cluster reports as the log sees them, driven by the test. */
function clusterSource (): {
  source: { observeCluster: (o: ClusterObserver) => () => void }
  observers: ClusterObserver[]
} {
  const observers: ClusterObserver[] = []
  return {
    observers,
    source: {
      observeCluster: (o) => {
        observers.push(o)
        return () => {
          observers.splice(observers.indexOf(o), 1)
        }
      }
    }
  }
}

t.test(
  'a name that fails every other lookup: one warning and one answer line a minute, the failures between counted in the next warning',
  async (t) => {
    const logged: Line[] = []
    const stream = new Writable({
      write (chunk: Buffer, _enc, done) {
        for (const l of lines(chunk.toString())) logged.push(JSON.parse(l) as Line)
        done()
      }
    })
    const app = Fastify({ logger: { level: 'info', stream } })
    t.teardown(async () => {
      await app.close()
    })
    const { source, observers } = clusterSource()
    let clock = 0
    logEngineEvents(app, source, () => clock)
    const timeout = Object.assign(new Error('queryA ETIMEOUT engines.test'), { code: 'ETIMEOUT' })
    // A lookup every 100 ms for 59.9 s, failing every other one.
    for (let i = 0; i < 600; i++, clock += 100) observers[0]!.lookup!('engines.test', i % 2 === 0 ? timeout : undefined)
    t.same(
      logged.map((l) => [l.msg.split(':')[0], l['failures']]),
      [
        ['engine name lookup failed', 1],
        ['engine name resolves again', undefined]
      ],
      'two lines in the first minute'
    )
    clock = LOOKUP_WARNING_EVERY_MS
    observers[0]!.lookup!('engines.test', timeout)
    t.same(
      logged.slice(2).map((l) => [l.msg.split(':')[0], l['reason'], l['failures']]),
      [['engine name lookup failed', 'ETIMEOUT', 300]],
      'a minute on, one warning with the 299 failures untold and this one'
    )
  }
)

t.test(
  "an app's close stops its reports: an engine client built into a second app tells each change once",
  async (t) => {
    const { source, observers } = clusterSource()
    const first = Fastify({ logger: false })
    logEngineEvents(first, source)
    t.equal(observers.length, 1)
    await first.close()
    t.equal(observers.length, 0, 'the closed app no longer listens')

    // The engine client's own side: an observer that stops is told nothing more; one that comes later hears a name
    // failing now.
    const dns = await startDnsServer()
    t.teardown(dns.close)
    const cluster = new EngineClient({
      url: 'http://engines.test:4000',
      timeoutMs: 1_000,
      lookup: serversLookup([dns.address]),
      resolveIntervalMs: 0,
      health: { intervalMs: 0 }
    })
    t.teardown(async () => {
      await cluster.close()
    })
    await cluster.ready()
    const heard: string[] = []
    const stop = cluster.observeCluster({
      lookup: (name, error) => {
        heard.push(`a ${name} ${(error as NodeJS.ErrnoException | undefined)?.code ?? 'ok'}`)
      }
    })
    cluster.observeCluster({
      lookup: (name, error) => {
        heard.push(`b ${name} ${(error as NodeJS.ErrnoException | undefined)?.code ?? 'ok'}`)
      }
    })
    stop()
    dns.set('engines.test', ['127.0.0.2'])
    await cluster.resolve()
    t.same(
      heard,
      ['a engines.test ENOTFOUND', 'b engines.test ENOTFOUND', 'b engines.test ok'],
      'both heard the failure at start when they came; only the one still listening heard the answer'
    )
  }
)
