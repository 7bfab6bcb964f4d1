/**
 * UPSTREAM_DNS_SERVERS that do not answer: at start-up the gateway listens
 * after the lookup gives up, says so in one warning, and its connections to
 * the name ask the configured servers (undici's `connect.lookup`), so the
 * first call after they answer reaches the engine without waiting for a
 * refresh. A lookup still pending when the endpoint set closes does not keep
 * the process alive.
 */
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { connect } from 'node:net'
import { join } from 'node:path'
import t, { type Test } from 'tap'
import { request } from 'undici'
import { startDnsServer, type DnsServer } from '../../deploy/local/dns.js'
import { waitUntil } from '../../deploy/local/parts.js'
import { startStubUpstream, type StubUpstream } from '../../fixtures/stub-upstream.js'
import { EngineClient } from '../../src/engine-client/client.js'
import { connectLookup, type Lookup } from '../../src/engine-client/endpoints.js'
import { bearer, SECRET } from '../helpers/app.js'
import { client, gatewayUrl, lines, SERVER, start } from '../helpers/gateway-process.js'
import { silentDnsServer } from '../helpers/dns.js'
import { ensureBuilt, freePort, ROOT } from '../helpers/processes.js'

t.before(ensureBuilt)

const NAME = 'engines.test'

async function dnsServer (t: Test): Promise<DnsServer> {
  const s = await startDnsServer()
  t.teardown(s.close)
  return s
}

async function engineAt (t: Test, host: string, port: number): Promise<StubUpstream> {
  const s = await startStubUpstream(undefined, { host, port })
  t.teardown(s.close)
  return s
}

const pingsOf = (s: StubUpstream): number => s.requests.filter((r) => r.url === '/api/portfolio/ping').length

t.test(
  'a gateway whose DNS servers are silent at start-up warns once, listens, and reaches the engine as soon as they answer, before any refresh',
  async (t) => {
    const dns = await dnsServer(t)
    const port = await freePort()
    const engine = await engineAt(t, '127.0.0.2', port)
    dns.set(NAME, ['127.0.0.2'])
    const servers = await silentDnsServer(t)
    const child = start(t, SERVER, {
      PORT: '0',
      JWT_SECRET: SECRET,
      UPSTREAM_URL: `http://${NAME}:${port}`,
      UPSTREAM_DNS_SERVERS: servers.address,
      // An hourly refresh: only a connection that asks the servers itself can reach the engine in this test.
      UPSTREAM_DNS_REFRESH_MS: '3600000'
    })
    const url = await gatewayUrl(child)
    t.ok(
      servers.dropped() >= 2,
      "the servers were asked (c-ares' two tries) and did not answer before the gateway listened"
    )
    const warnings = lines(child.out())
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Record<string, unknown>)
      .filter((e) => e['level'] === 40)
    t.same(
      warnings.map((w) => [w['msg'], w['name'], w['reason'], w['failures']]),
      [
        [
          'engine name lookup failed: its endpoints are kept as they were, and it is asked again at the next refresh',
          NAME,
          'ETIMEOUT',
          1
        ]
      ],
      'one warning, naming the name and why'
    )

    servers.answerWith(dns)
    const res = await request(`${url}/api/portfolio/ping`, { headers: bearer(), dispatcher: client(t) })
    t.equal(res.statusCode, 200, 'the first ping after the servers answer is answered')
    t.equal(await res.body.text(), 'pong')
    t.equal(pingsOf(engine), 1, 'by the engine at the address the servers gave')
    t.equal(
      engine.requests.find((r) => r.url === '/api/portfolio/ping')?.headers.host,
      `${NAME}:${port}`,
      'the name is the Host'
    )
    t.same(lines(child.err()), [], 'nothing on stderr')
  }
)

t.test(
  "before its first answer, a name's connections ask the configured lookup, not getaddrinfo (which does not know it)",
  async (t) => {
    const port = await freePort()
    const engine = await engineAt(t, '127.0.0.3', port)
    let answering = false
    const asked: string[] = []
    const lookup: Lookup = async (hostname) => {
      asked.push(hostname)
      if (!answering) throw Object.assign(new Error(`queryA ETIMEOUT ${hostname}`), { code: 'ETIMEOUT' })
      return [
        { address: '::1', family: 6 },
        { address: '127.0.0.3', family: 4 }
      ]
    }
    const cluster = new EngineClient({
      url: `http://${NAME}:${port}`,
      timeoutMs: 5_000,
      lookup,
      connectWithLookup: true,
      resolveIntervalMs: 0,
      health: { intervalMs: 0 }
    })
    t.teardown(async () => {
      await cluster.close()
    })
    await cluster.ready()
    t.same(
      cluster.status().endpoints.map((e) => e.endpoint),
      [`${NAME}:${port}`],
      'the first lookup failed: the name stands for itself'
    )
    answering = true
    const res = await cluster.call({ method: 'GET', path: '/api/portfolio/ping', requestId: 'r1' })
    t.equal(res.status, 200)
    t.equal(pingsOf(engine), 1, "the call reached the engine at the lookup's IPv4 address (V4_PREFERRED)")
    t.same(asked, [NAME, NAME], 'the first resolution, then the connection')
    t.same(
      cluster.status().endpoints.map((e) => e.endpoint),
      [`${NAME}:${port}`],
      "through the connection's own lookup: no resolution of the set was needed"
    )
  }
)

t.test(
  "before its first answer, a name's health checks ask the configured lookup too: the check passes on the name itself, and nothing re-resolves the set",
  async (t) => {
    const port = await freePort()
    const engine = await engineAt(t, '127.0.0.3', port)
    let answering = false
    const lookup: Lookup = async (hostname) => {
      if (!answering) throw Object.assign(new Error(`queryA ETIMEOUT ${hostname}`), { code: 'ETIMEOUT' })
      return [{ address: '127.0.0.3', family: 4 }]
    }
    const cluster = new EngineClient({
      url: `http://${NAME}:${port}`,
      timeoutMs: 5_000,
      lookup,
      connectWithLookup: true,
      resolveIntervalMs: 0,
      health: { intervalMs: 50, timeoutMs: 5_000 }
    })
    t.teardown(async () => {
      await cluster.close()
    })
    await cluster.ready()
    answering = true
    // getaddrinfo does not know the name: a check through it fails (ENOTFOUND), which asks DNS again
    // and replaces the name by its address before any check reaches the engine.
    await waitUntil(
      'a health check reaching the engine',
      async () => engine.requests.some((r) => r.url === '/health'),
      10_000
    )
    t.same(
      cluster.status().endpoints.map((e) => [e.endpoint, e.state]),
      [[`${NAME}:${port}`, 'up']],
      'the check reached the engine through the name itself, which is still the set'
    )
  }
)

t.test("connectLookup answers in net.connect's shape: one address, all of them, or the family asked for", async (t) => {
  const lookup: Lookup = async () => [
    { address: '127.0.0.5', family: 4 },
    { address: 'fd00::5', family: 6 },
    { address: '127.0.0.4', family: 4 }
  ]
  const onlySix: Lookup = async () => [{ address: 'fd00::5', family: 6 }]
  const ask = async (l: Lookup, options: Parameters<ReturnType<typeof connectLookup>>[1]): Promise<unknown> =>
    await new Promise((resolve) => {
      connectLookup(l)(NAME, options, (err, address, family) => {
        resolve(err === null ? { address, family } : { code: err.code })
      })
    })
  t.same(await ask(lookup, {}), { address: '127.0.0.4', family: 4 }, 'one address: the first IPv4 one')
  t.same(
    await ask(lookup, { all: true }),
    {
      address: [
        { address: '127.0.0.4', family: 4 },
        { address: '127.0.0.5', family: 4 }
      ],
      family: undefined
    },
    'all: every IPv4 address (V4_PREFERRED)'
  )
  t.same(
    await ask(onlySix, { all: true }),
    { address: [{ address: 'fd00::5', family: 6 }], family: undefined },
    'an IPv6-only name: its IPv6 addresses'
  )
  t.same(await ask(lookup, { family: 6 }), { code: 'ENOTFOUND' }, 'family 6 of a name used by IPv4: none')
  t.same(await ask(onlySix, { family: 'IPv6' }), { address: 'fd00::5', family: 6 })
  t.same(
    await ask(async () => {
      throw Object.assign(new Error('queryA ESERVFAIL'), { code: 'ESERVFAIL' })
    }, {}),
    { code: 'ESERVFAIL' },
    'a failed lookup fails the connection with its code'
  )
  // The real thing: net.connect with Node's autoSelectFamily, which asks for all addresses.
  const server = await startStubUpstream()
  t.teardown(server.close)
  const socket = connect({
    host: NAME,
    port: server.port,
    lookup: connectLookup(async () => [{ address: '127.0.0.1', family: 4 }]),
    autoSelectFamily: true
  })
  await once(socket, 'connect')
  t.equal(socket.remoteAddress, '127.0.0.1', 'net.connect reached the address the lookup gave')
  socket.destroy()
})

t.test(
  'closing the endpoint set gives up a lookup waiting on a silent server: the process exits at once',
  async (t) => {
    const silent = await silentDnsServer(t)
    const endpoints = join(ROOT, 'dist', 'src', 'engine-client', 'endpoints.js')
    // The set asks the silent server, then closes when the test says (the query is pending by then).
    const script = `
    import { Pool } from 'undici'
    const { EndpointSet, serversLookup } = await import(${JSON.stringify(endpoints)})
    const set = new EndpointSet({ urls: ['http://${NAME}:4000'], pool: (origin) => new Pool(origin), lookup: serversLookup(['${silent.address}']) })
    process.stdin.once('data', async () => {
      process.stdin.destroy()
      await set.close()
      console.log('closed')
    })
  `
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], {
      cwd: ROOT,
      stdio: ['pipe', 'pipe', 'pipe']
    })
    t.teardown(() => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
    })
    let err = ''
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => {
      err += chunk
    })
    const exited = once(child, 'exit')
    await once(silent.socket, 'message')
    child.stdin.write('close\n')
    await once(child.stdout, 'data')
    const closed = performance.now()
    const [code] = (await exited) as [number | null]
    const afterClose = performance.now() - closed
    t.equal(code, 0)
    t.equal(err, '', 'nothing on stderr')
    t.equal(silent.dropped(), 1, 'the lookup was pending on its first try when the set closed')
    t.comment(`exited ${Math.round(afterClose)} ms after close`)
    // Without the cancel, c-ares' second try (1 s, then 2 s) would hold the process about 3 s after close.
    t.ok(afterClose < 1_000, `the process exited within 1 s of close (${Math.round(afterClose)} ms)`)
  }
)
