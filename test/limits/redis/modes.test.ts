/**
 * The Sentinel mode end to end, small (DECISIONS 26): a primary, one replica
 * and one Sentinel (Debian's redis-server in sentinel mode). A forced
 * failover (SENTINEL FAILOVER) promotes the replica; the gateway follows by
 * itself and counts the role change in gateway_redis_failovers_total.
 * (The full failover under load, with SIGKILL and three Sentinels, is
 * test/*sentinel* by the system tests.)
 */
import { spawn } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Redis } from 'ioredis'
import t from 'tap'
import { request } from 'undici'
import { startStubUpstream } from '../../../fixtures/stub-upstream.js'
import { bearer, build, hs256, validUpdate } from '../../helpers/app.js'
import { metricOf } from '../../helpers/prometheus.js'
import { freePort } from '../../helpers/processes.js'
import { attemptUntil } from '../../helpers/engine.js'
import { requireRedis, startRedis } from '../../helpers/redis.js'

const eventually = async <T>(attempt: () => Promise<T>, done: (value: T) => boolean): Promise<T> =>
  await attemptUntil(attempt, done, 20_000)

if (requireRedis(t)) {
  t.test('Sentinel: the gateway finds the master, follows a failover, and counts it', async (t) => {
    const primary = await startRedis(t)
    const replica = await startRedis(t, { args: ['--replicaof', '127.0.0.1', String(primary.port)] })
    const dir = mkdtempSync(join(tmpdir(), 'redis-sentinel-'))
    t.teardown(() => rmSync(dir, { recursive: true, force: true }))
    const port = await freePort()
    const conf = join(dir, 'sentinel.conf')
    writeFileSync(
      conf,
      [
        `port ${port}`,
        'bind 127.0.0.1',
        `dir ${dir}`,
        `sentinel monitor gw 127.0.0.1 ${primary.port} 1`,
        'sentinel down-after-milliseconds gw 1000',
        'sentinel failover-timeout gw 5000',
        ''
      ].join('\n')
    )
    const sentinel = spawn('redis-server', [conf, '--sentinel'], { stdio: ['ignore', 'pipe', 'pipe'] })
    t.teardown(() => {
      sentinel.kill('SIGKILL')
    })
    let out = ''
    await new Promise<void>((resolve, reject) => {
      sentinel.stdout.setEncoding('utf8').on('data', (chunk: string) => {
        out += chunk
        if (out.includes('+monitor master')) resolve()
      })
      sentinel.once('exit', (code) => reject(new Error(`redis-sentinel exited (${String(code)}):\n${out}`)))
    })
    const sentinelProbe = new Redis({ port, host: '127.0.0.1' })
    t.teardown(() => sentinelProbe.disconnect())
    // The Sentinel learns of the replica from the primary's INFO (every 10 s at first).
    await eventually(
      async () => (await sentinelProbe.call('SENTINEL', 'REPLICAS', 'gw')) as unknown[],
      (replicas) => replicas.length > 0
    )

    const stub = await startStubUpstream()
    t.teardown(() => stub.close())
    const { metrics, url } = await build(t, {
      upstreamUrl: stub.url,
      env: { REDIS_SENTINELS: `127.0.0.1:${port}`, REDIS_SENTINEL_NAME: 'gw', RATE_LIMIT_PER_MINUTE: '1000' }
    })
    let n = 0
    const keyed = async (): Promise<number> => {
      const res = await request(`${url}/api/portfolio/update`, {
        method: 'POST',
        body: JSON.stringify(validUpdate()),
        headers: { ...bearer(hs256()), 'content-type': 'application/json', 'idempotency-key': `s-${n++}` }
      })
      await res.body.dump()
      return res.statusCode
    }
    t.equal(await eventually(keyed, (s) => s === 200), 200, 'connected through the Sentinel')
    const onPrimary = new Redis(primary.url)
    t.teardown(() => onPrimary.disconnect())
    t.ok((await onPrimary.keys('pgw:idem:{alice}:*')).length > 0, 'the records are on the primary')
    t.equal(await metricOf(metrics, 'gateway_redis_failovers_total'), 0)

    t.equal(await sentinelProbe.call('SENTINEL', 'FAILOVER', 'gw'), 'OK', 'forced failover')
    const failovers = await eventually(
      async () => await metricOf(metrics, 'gateway_redis_failovers_total'),
      (v) => v === 1
    )
    t.equal(failovers, 1, 'the role change is counted')
    t.equal(await eventually(keyed, (s) => s === 200), 200, 'keyed requests are stored again')
    const onReplica = new Redis(replica.url)
    t.teardown(() => onReplica.disconnect())
    t.match(await onReplica.info('replication'), /^role:master/m, 'on the promoted replica')
    t.equal(await metricOf(metrics, 'gateway_redis_up'), 1)
  })

  t.test('Cluster with a replica: records wait for it; a replica promoted is followed and counted', async (t) => {
    const dirs = [0, 1].map(() => mkdtempSync(join(tmpdir(), 'redis-cluster-')))
    t.teardown(() => {
      for (const dir of dirs) rmSync(dir, { recursive: true, force: true })
    })
    // Announced at 127.0.0.1: a node alone reports its address as '' in CLUSTER SLOTS.
    const [a, b] = await Promise.all(
      dirs.map(
        async (dir) =>
          await startRedis(t, {
            args: ['--cluster-enabled', 'yes', '--dir', dir, '--cluster-announce-ip', '127.0.0.1']
          })
      )
    )
    const probeA = new Redis(a!.url)
    const probeB = new Redis(b!.url)
    t.teardown(() => {
      probeA.disconnect()
      probeB.disconnect()
    })
    await probeA.cluster('ADDSLOTSRANGE', 0, 16383)
    const idA = (await probeA.cluster('MYID')) as string
    await probeB.cluster('MEET', '127.0.0.1', a!.port)
    await eventually(
      async () => (await probeB.cluster('NODES')) as string,
      (nodes) => new RegExp(`^${idA} \\S+ master - `, 'm').test(nodes)
    )
    await probeB.cluster('REPLICATE', idA)
    await eventually(
      async () => await probeA.info('replication'),
      (info) => /^slave0:.*state=online/m.test(info)
    )
    await eventually(
      async () => (await probeB.cluster('INFO')) as string,
      (info) => /cluster_state:ok/.test(info)
    )

    const stub = await startStubUpstream()
    t.teardown(() => stub.close())
    const { metrics, url } = await build(t, {
      upstreamUrl: stub.url,
      env: { REDIS_CLUSTER_NODES: `127.0.0.1:${a!.port}`, RATE_LIMIT_PER_MINUTE: '1000' }
    })
    let n = 0
    const keyed = async (): Promise<number> => {
      const res = await request(`${url}/api/portfolio/update`, {
        method: 'POST',
        body: JSON.stringify(validUpdate()),
        headers: { ...bearer(hs256()), 'content-type': 'application/json', 'idempotency-key': `c-${n++}` }
      })
      await res.body.dump()
      return res.statusCode
    }
    const waitsAt = async (probe: Redis): Promise<number> =>
      Number(/^cmdstat_wait:calls=(\d+)/m.exec(await probe.info('commandstats'))?.[1] ?? 0)
    t.equal(await eventually(keyed, (s) => s === 200), 200, 'connected to the cluster')
    t.ok(
      (await eventually(
        async () => {
          await keyed()
          return await waitsAt(probeA)
        },
        (w) => w > 0
      )) > 0,
      "a stored record waits for the primary's replica (WAIT on its node)"
    )
    const missed = async (): Promise<number> =>
      (await metricOf(metrics, 'gateway_redis_replication_lag_total', { reason: 'missed' })) ?? 0
    // A starved replica may miss one 100 ms WAIT on a loaded runner: a record it acknowledges counts no miss.
    t.equal(
      await eventually(
        async () => {
          const from = await missed()
          await keyed()
          return (await missed()) - from
        },
        (d) => d === 0
      ),
      0,
      'an acknowledged record counts no miss'
    )
    t.equal(await metricOf(metrics, 'gateway_redis_failovers_total'), 0)

    t.equal(await probeB.cluster('FAILOVER'), 'OK', 'manual failover: the replica takes over')
    await eventually(
      async () => await probeB.info('replication'),
      (info) => /^role:master/m.test(info)
    )
    // The next write meets MOVED at the old primary, or the 5 s slot refresh comes first: either refreshes the map.
    t.equal(
      await eventually(
        async () => {
          await keyed()
          return await metricOf(metrics, 'gateway_redis_failovers_total')
        },
        (v) => v === 1
      ),
      1,
      'the promotion is counted'
    )
    t.equal(await eventually(keyed, (s) => s === 200), 200, 'keyed requests are stored on the new primary')
    t.ok((await probeB.keys('pgw:idem:{alice}:*')).length > 0)
    t.equal(await metricOf(metrics, 'gateway_redis_up'), 1)
  })
}
