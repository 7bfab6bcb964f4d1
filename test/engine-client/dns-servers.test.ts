/**
 * UPSTREAM_DNS_SERVERS: UPSTREAM_URL's host names asked of these servers
 * directly (c-ares), not of getaddrinfo and /etc/resolv.conf's nameservers,
 * with the system lookup's semantics (IPv4 when the name has any, IPv6 only
 * when it has none; a failed lookup keeps what the name had). Against
 * deploy/local/dns.ts over real UDP, and a gateway process that follows a
 * name the system resolver does not know as it changes.
 */
import { createSocket } from 'node:dgram'
import { once } from 'node:events'
import t, { type Test } from 'tap'
import { request } from 'undici'
import { startDnsServer, type DnsServer } from '../../deploy/local/dns.js'
import { waitUntil } from '../../deploy/local/parts.js'
import { contractHandler, startStubUpstream, type StubUpstream } from '../../fixtures/stub-upstream.js'
import { ConfigError, loadConfig } from '../../src/config.js'
import { serversLookup } from '../../src/engine-client/endpoints.js'
import { bearer, SECRET } from '../helpers/app.js'
import { silentDnsServer } from '../helpers/dns.js'
import { client, exitOf, gatewayUrl, lines, SERVER, start } from '../helpers/gateway-process.js'
import { ensureBuilt, freePort } from '../helpers/processes.js'

t.before(ensureBuilt)

async function dnsServer (t: Test): Promise<DnsServer> {
  const s = await startDnsServer()
  t.teardown(s.close)
  return s
}

/**
 * A UDP relay in front of `dns` that holds the first query `delayMs` (less than
 * c-ares' 1 s per try) before passing it on, and the later ones not at all; its host:port.
 */
async function slowRelay (t: Test, dns: DnsServer, delayMs: number): Promise<string> {
  const socket = createSocket('udp4')
  socket.bind(0, '127.0.0.1')
  await once(socket, 'listening')
  t.teardown(() => socket.close())
  const clients = new Map<number, { port: number; address: string }>()
  let first = true
  socket.on('message', (msg, peer) => {
    if (peer.port === dns.port) {
      const client = clients.get(msg.readUInt16BE(0))
      if (client !== undefined) socket.send(msg, client.port, client.address)
      return
    }
    clients.set(msg.readUInt16BE(0), peer)
    const forward = (): void => {
      socket.send(msg, dns.port, dns.host)
    }
    if (first) setTimeout(forward, delayMs)
    else forward()
    first = false
  })
  return `127.0.0.1:${socket.address().port}`
}

const codeOf = async (p: Promise<unknown>): Promise<string | undefined> =>
  await p.then(
    () => undefined,
    (err: NodeJS.ErrnoException) => err.code
  )

t.test('the lookup: A records when there are any, AAAA only when there are none, failures as failures', async (t) => {
  const dns = await dnsServer(t)
  const lookup = serversLookup([dns.address])
  dns.set('dual.test', ['::1', '127.0.0.3', '127.0.0.2'])
  dns.set('six.test', ['fd00::2', '::1'])
  dns.set('empty.test', [])
  t.same(
    await lookup('dual.test'),
    [
      { address: '127.0.0.3', family: 4 },
      { address: '127.0.0.2', family: 4 }
    ],
    'a dual-stack name: its IPv4 addresses only (V4_PREFERRED)'
  )
  t.same(
    await lookup('six.test'),
    [
      { address: 'fd00::2', family: 6 },
      { address: '::1', family: 6 }
    ],
    'an IPv6-only name: its IPv6 addresses'
  )
  t.equal(
    await codeOf(lookup('empty.test')),
    'ENODATA',
    'a name with no address fails the lookup (the set keeps what it had)'
  )
  t.equal(await codeOf(lookup('nobody.test')), 'ENOTFOUND', 'NXDOMAIN fails the lookup')
  // /etc/hosts names localhost for getaddrinfo; the configured server does not know it, and is the only one asked.
  t.equal(await codeOf(lookup('localhost')), 'ENOTFOUND', 'neither /etc/hosts nor the system resolver answers')
  dns.set('dual.test', ['127.0.0.4'])
  t.same(
    await lookup('dual.test'),
    [{ address: '127.0.0.4', family: 4 }],
    'a change is seen at the next lookup: nothing cached (TTL 0)'
  )
})

t.test("a server that never answers fails the lookup after c-ares' own tries (1 s, then 2 s)", async (t) => {
  const silent = await silentDnsServer(t)
  const code = await codeOf(serversLookup([silent.address])('engines.test'))
  t.equal(code, 'ETIMEOUT')
  t.equal(silent.dropped(), 2, 'two tries, then it gives up (within the 5 s lookup deadline of endpoints.ts)')
})

t.test(
  'UPSTREAM_DNS_SERVERS in the config: addresses with optional ports, IPv6 too; anything else stops start-up with one line',
  async (t) => {
    const base = { JWT_SECRET: SECRET, UPSTREAM_URL: 'http://engines.test:4000' }
    t.equal(loadConfig(base).upstreamDnsServers, undefined, 'unset: the system resolver')
    t.same(loadConfig({ ...base, UPSTREAM_DNS_SERVERS: '10.96.0.10' }).upstreamDnsServers, ['10.96.0.10'])
    t.same(
      loadConfig({ ...base, UPSTREAM_DNS_SERVERS: '127.0.0.1:5353, ::1,[fd00::53]:53,[::1]' }).upstreamDnsServers,
      ['127.0.0.1:5353', '::1', '[fd00::53]:53', '[::1]']
    )
    const expected = 'expected comma-separated ip or ip:port, IPv6 as [ip]:port, e.g. 10.96.0.10,127.0.0.1:5353'
    for (const [value, entry] of [
      ['kube-dns.kube-system', 'kube-dns.kube-system'],
      ['10.96.0.10,dns:53', 'dns:53'],
      ['10.96.0.300', '10.96.0.300'],
      ['127.0.0.1:0', '127.0.0.1:0'],
      ['127.0.0.1:65536', '127.0.0.1:65536'],
      ['127.0.0.1:', '127.0.0.1:'],
      ['[fd00::53', '[fd00::53'],
      ['[127.0.0.1]:53', '[127.0.0.1]:53'],
      ['10.0.0.1,,10.0.0.2', '']
    ] as const) {
      t.throws(
        () => loadConfig({ ...base, UPSTREAM_DNS_SERVERS: value }),
        new ConfigError(
          `UPSTREAM_DNS_SERVERS=${JSON.stringify(value)} is invalid: ${JSON.stringify(entry)} is not an IP address with an optional port 1-65535; ${expected}`
        ),
        value
      )
    }
  }
)

t.test('a gateway process with an invalid UPSTREAM_DNS_SERVERS exits 1 with one line', async (t) => {
  const child = start(t, SERVER, {
    NODE_ENV: 'production',
    PORT: '0',
    JWT_SECRET: SECRET,
    UPSTREAM_URL: 'http://engines.test:4000',
    UPSTREAM_DNS_SERVERS: 'kube-dns:53'
  })
  t.same(await exitOf(child), { code: 1, signal: null })
  t.same(lines(child.err()), [
    'portfolio-gateway: UPSTREAM_DNS_SERVERS="kube-dns:53" is invalid: "kube-dns:53" is not an IP address with an optional port 1-65535; expected comma-separated ip or ip:port, IPv6 as [ip]:port, e.g. 10.96.0.10,127.0.0.1:5353'
  ])
  t.equal(child.out(), '', 'nothing on stdout: it never started')
})

t.test(
  'set while UPSTREAM_URL has only IP addresses: the gateway starts and warns that the servers are never asked',
  async (t) => {
    const child = start(t, SERVER, {
      PORT: '0',
      JWT_SECRET: SECRET,
      UPSTREAM_URL: 'http://127.0.0.1:9',
      UPSTREAM_DNS_SERVERS: '127.0.0.1:5353'
    })
    await gatewayUrl(child)
    const warnings = lines(child.out())
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as { level: number; msg: string; upstreamDnsServers?: string[] })
      .filter((e) => e.level === 40)
    t.same(
      warnings.map((w) => [w.msg, w.upstreamDnsServers]),
      [
        [
          'UPSTREAM_DNS_SERVERS is set, but UPSTREAM_URL names no host (only IP addresses, or unset): nothing is resolved, the servers are never asked',
          ['127.0.0.1:5353']
        ]
      ]
    )
  }
)

t.test(
  'a gateway listens once a name that only the configured server knows is resolved, and follows its address as it changes, at the next refresh',
  async (t) => {
    const dns = await dnsServer(t)
    const port = await freePort()
    const stubs: StubUpstream[] = []
    for (const host of ['127.0.0.2', '127.0.0.3']) {
      const s = await startStubUpstream(contractHandler, { host, port })
      t.teardown(s.close)
      stubs.push(s)
    }
    const [old, next] = stubs as [StubUpstream, StubUpstream]
    const name = 'engines.test'
    dns.set(name, ['127.0.0.2'])
    // The first answer comes late (a busy cluster DNS): without the wait for it, the gateway would listen first.
    const relay = await slowRelay(t, dns, 700)
    const refreshMs = 1_000
    const child = start(t, SERVER, {
      PORT: '0',
      JWT_SECRET: SECRET,
      UPSTREAM_URL: `http://${name}:${port}`,
      UPSTREAM_DNS_SERVERS: relay,
      UPSTREAM_DNS_REFRESH_MS: String(refreshMs)
    })
    const url = await gatewayUrl(child)
    const dispatcher = client(t)
    const pings = (s: StubUpstream): number => s.requests.filter((r) => r.url === '/api/portfolio/ping').length
    const ping = async (): Promise<number> => {
      const res = await request(`${url}/api/portfolio/ping`, { headers: bearer(), dispatcher })
      await res.body.dump()
      return res.statusCode
    }
    // The system resolver does not know the name, so the gateway listens only once the configured server has
    // answered: the very first ping goes to the address it gave.
    t.ok(dns.queries(name) > 0, 'the configured server was asked before the gateway listened')
    t.equal(await ping(), 200, 'the first ping is answered')
    t.equal(pings(old), 1, 'by the engine at the address the server gave')
    t.equal(
      old.requests.find((r) => r.url === '/api/portfolio/ping')?.headers.host,
      `${name}:${port}`,
      'the name is the Host'
    )

    dns.set(name, ['127.0.0.3'])
    const changed = performance.now()
    // The old engine still answers, so nothing but the periodic refresh can move the gateway.
    await waitUntil(
      'pings reaching the new address',
      async () => {
        await ping()
        return pings(next) > 0
      },
      15_000
    )
    t.comment(
      `followed ${Math.round(performance.now() - changed)} ms after the change (UPSTREAM_DNS_REFRESH_MS=${refreshMs})`
    )
    const before = pings(old)
    const statuses = []
    for (let i = 0; i < 10; i++) statuses.push(await ping())
    t.same(statuses, Array(10).fill(200), 'every ping answered')
    t.equal(pings(old), before, 'the old address gets no more pings')
    t.same(lines(child.err()), [], 'nothing on stderr')
  }
)
