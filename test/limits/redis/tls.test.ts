/**
 * Redis over TLS (DECISIONS 17, 26): a redis-server that speaks
 * only TLS, its certificate signed by a CA made in the test with openssl and
 * a password required. A gateway process given `rediss://` and REDIS_TLS_CA
 * counts its limits and stores its records there; one without the CA cannot
 * verify the server, so it acts as with Redis down (limits open, keyed
 * requests 503), and neither ever logs the password.
 */
import t from 'tap'
import { hs256 } from '../../helpers/app.js'
import { clearOfWindowEdge } from '../../helpers/window.js'
import { scrape, valueOf } from '../../helpers/prometheus.js'
import { create, type Gateway, ping, startEngineProcess, startGateway } from '../../helpers/redis-gateways.js'
import { probe, requireTools, startTlsRedis } from '../../helpers/redis-topology.js'

const PASSWORD = 'tls-test-password-6f1c9a'
const LIMIT = 3

if (requireTools(t, ['redis-server', 'openssl'], 'Redis TLS')) {
  t.test('rediss:// with REDIS_TLS_CA works; without the CA the gateway acts as with Redis down', async (t) => {
    const redis = await startTlsRedis(t, { password: PASSWORD })
    const engine = await startEngineProcess(t)
    const node = probe(t, redis.port, { ca: redis.files.ca, password: PASSWORD })
    const gateways: Gateway[] = []

    t.test('with the CA: limits counted in Redis, records stored and replayed', async (t) => {
      const gw = await startGateway(t, engine.url, {
        REDIS_URL: redis.url,
        REDIS_TLS_CA: redis.files.caFile,
        RATE_LIMIT_PER_MINUTE: String(LIMIT)
      })
      gateways.push(gw)
      const token = hs256({ sub: 'tls-user' })
      // Both of its connections (counters, records) are up: it says so once.
      await gw.waitFor(/redis connected/)
      // Four requests counted in one clock-aligned window.
      await clearOfWindowEdge()
      const first = await create(gw.url, 'tls-1', token)
      t.equal(first.status, 200, first.text)
      const replay = await create(gw.url, 'tls-1', token)
      t.equal(replay.status, 200)
      t.equal(replay.headers['idempotent-replayed'], 'true')
      t.equal(replay.text, first.text)
      const pings = [await ping(gw.url, token), await ping(gw.url, token)]
      t.same(
        pings.map((p) => p.status),
        [200, 429],
        'the third request of the minute is the last one allowed'
      )
      t.match(pings[0]!.headers['ratelimit'], /^"default";r=0;t=\d+$/)
      // In Redis, under the user's hash tag: the record, and the counter at 4.
      const keys = ((await node.call('KEYS', '*{tls-user}*')) as string[]).sort()
      t.equal(keys.length, 2, keys.join(' '))
      const counter = keys.find((k) => k.includes(':rl:'))
      t.ok(
        keys.some((k) => k.includes(':idem:') && k.endsWith(':tls-1')),
        'the record'
      )
      t.equal(
        counter === undefined ? undefined : await node.get(counter),
        '4',
        'the counter: two creates and two pings'
      )
      t.equal(valueOf((await scrape(gw.metricsUrl)).samples, 'gateway_redis_up'), 1, 'gateway_redis_up 1')
    })

    t.test('without the CA: limits open, keyed requests 503 with Retry-After', async (t) => {
      const gw = await startGateway(t, engine.url, { REDIS_URL: redis.url, RATE_LIMIT_PER_MINUTE: String(LIMIT) })
      gateways.push(gw)
      await gw.waitFor(/redis unavailable/)
      const token = hs256({ sub: 'tls-user-2' })
      const pings = await Promise.all(Array.from({ length: LIMIT + 2 }, () => ping(gw.url, token)))
      t.same(
        pings.map((p) => p.status),
        Array(LIMIT + 2).fill(200),
        'past the limit and still 200: the limit fails open'
      )
      t.same(
        pings.map((p) => p.headers['ratelimit']),
        Array(LIMIT + 2).fill(undefined),
        'not counted anywhere'
      )
      const keyed = await create(gw.url, 'tls-2', token)
      t.equal(keyed.status, 503)
      t.same(keyed.json, { error: 'idempotency store unavailable, retry later' })
      t.equal(keyed.headers['retry-after'], '1')
      t.same(await node.call('KEYS', '*{tls-user-2}*'), [], 'nothing reached Redis')
      t.equal(gw.count(/redis unavailable/), 1, 'said once, not once per reconnect attempt')
      // (Its reason is the first error of either connection: the certificate, or a
      // connect timeout on a busy machine, so it is not asserted.)
      t.equal(valueOf((await scrape(gw.metricsUrl)).samples, 'gateway_redis_up'), 0, 'gateway_redis_up 0')
    })

    t.test('no password in any log', async (t) => {
      t.equal(gateways.length, 2)
      for (const gw of gateways) {
        t.notOk(gw.out().includes(PASSWORD), 'not on stdout')
        t.notOk(gw.err().includes(PASSWORD), 'not on stderr')
      }
    })
  })
}
