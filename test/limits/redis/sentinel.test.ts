/**
 * A Sentinel failover under load (DECISIONS 17, 26): a primary, one
 * replica and three sentinels; two gateway processes on REDIS_SENTINELS in
 * front of one reference engine, under a steady load of ping, update and
 * keyed create. The primary is SIGKILLed. Pings and updates never fail; keyed
 * creates get 200 or 503 with Retry-After while no master answers; within 5 s
 * of Sentinel's +switch-master everything is 200 again; every create retried
 * after the failover is replayed, and the engine creates each portfolio once.
 */
import t from 'tap'
import { hs256, MINTS } from '../../helpers/app.js'
import { scrape, valueOf } from '../../helpers/prometheus.js'
import {
  type Answer,
  create,
  CREATED,
  type Gateway,
  ping,
  REPEATED,
  startEngineProcess,
  startGateway,
  untilStoring,
  update,
  waitUntil,
  within
} from '../../helpers/redis-gateways.js'
import { MASTER_NAME, requireTools, startSentinels } from '../../helpers/redis-topology.js'

// A Sentinel failover under load: its one test allows 120 s, and the file needs room around it.
t.setTimeout(180_000)

interface Sent {
  kind: 'ping' | 'update' | 'create'
  gateway: number
  key?: string
  /** The creator's token: each worker creates as a user of its own. */
  token?: string
  sentAt: number
  doneAt: number
  answer: Answer | undefined
  error?: string
}

/** Whole seconds Retry-After, as DECISIONS 17 gives it. */
const RETRY_AFTER = /^[1-9]\d*$/

if (requireTools(t, ['redis-server', 'redis-sentinel'], 'Redis Sentinel')) {
  // Five Redis processes, two gateways, an engine and a failover: generous on a loaded runner.
  t.setTimeout(120_000)
  t.test(
    'SIGKILL of the primary under load: limits open, keyed creates 200 or 503, back within 5 s of +switch-master, nothing created twice',
    async (t) => {
      const topology = await startSentinels(t)
      const engine = await startEngineProcess(t)
      const env = {
        REDIS_SENTINELS: topology.sentinelList,
        REDIS_SENTINEL_NAME: MASTER_NAME,
        // Counted in Redis, never reached: a refusal would hide a failure.
        RATE_LIMIT_PER_MINUTE: '100000',
        // A pending claim lasts the engine timeout + 5 s (src/limits/limits.ts).
        UPSTREAM_TIMEOUT_MS: '3000'
      }
      const gateways: Gateway[] = await Promise.all([
        startGateway(t, engine.url, env),
        startGateway(t, engine.url, env)
      ])
      await Promise.all(gateways.map((gw) => untilStoring(gw)))

      const token = hs256({ sub: 'failover-user' })
      const setup = await create(gateways[0]!.url, 'setup', token)
      t.equal(setup.status, 200, setup.text)
      const portfolioId = (setup.json as { portfolio_id: string }).portfolio_id
      const updateBody = {
        portfolio_id: portfolioId,
        target_positions: [
          { mint: MINTS[0], allocation: 0.5 },
          { mint: MINTS[1], allocation: 0.5 }
        ]
      }

      // The load: two workers per gateway, each a ping, an update and a create
      // with a new key, then a short pause; bounded in count and in time.
      const sent: Sent[] = []
      let stop = false
      let serial = 0
      // Each worker creates as a user of its own: the upload cap (2 per user, DECISIONS 23) holds across both gateways.
      const creators = [0, 1, 2, 3].map((w) => hs256({ sub: `failover-creator-${w}` }))
      async function send (kind: Sent['kind'], gateway: number, worker: number): Promise<void> {
        const url = gateways[gateway]!.url
        const key = kind === 'create' ? `fo-${serial++}` : undefined
        const creator = creators[worker]!
        const entry: Sent = {
          kind,
          gateway,
          sentAt: Date.now(),
          doneAt: 0,
          answer: undefined,
          ...(key === undefined ? {} : { key, token: creator })
        }
        try {
          entry.answer =
            kind === 'ping'
              ? await ping(url, token)
              : kind === 'update'
                ? await update(url, updateBody, { token })
                : await create(url, key!, creator)
        } catch (err) {
          entry.error = (err as Error).message
        }
        entry.doneAt = Date.now()
        sent.push(entry)
      }
      const worker = async (gateway: number, w: number): Promise<void> => {
        for (let i = 0; i < 600 && !stop; i++) {
          await send('ping', gateway, w)
          await send('update', gateway, w)
          await send('create', gateway, w)
          await new Promise((resolve) => setTimeout(resolve, 25))
        }
      }
      const hardStop = setTimeout(() => {
        stop = true
      }, 40_000)
      const workers = [0, 1, 0, 1].map(async (gateway, w) => await worker(gateway, w))
      const createdThrough = (gateway: number): number =>
        sent.filter((s) => s.kind === 'create' && s.gateway === gateway && s.answer?.status === 200).length

      // Steady first: creates through each gateway.
      await waitUntil('10 creates through each gateway', () => createdThrough(0) >= 10 && createdThrough(1) >= 10)
      t.equal(
        await topology.masterAddress(),
        `127.0.0.1:${topology.primary.port}`,
        'the sentinels see the primary as master'
      )

      const killAt = Date.now()
      await topology.primary.kill()
      const switched = await within(topology.switched, 30_000, '+switch-master')
      t.equal(switched.address, `127.0.0.1:${topology.replica.port}`, 'Sentinel promoted the replica')
      // Load goes on 6 s past the announcement: the last second shows the steady state.
      await waitUntil('6 s after +switch-master', () => Date.now() > switched.at + 6_000)
      stop = true
      clearTimeout(hardStop)
      await Promise.all(workers)

      const failures = (kind: Sent['kind']): Sent[] => sent.filter((s) => s.kind === kind && s.answer?.status !== 200)
      t.same(
        failures('ping').map((s) => s.answer?.status ?? s.error),
        [],
        `no ping failed (${sent.filter((s) => s.kind === 'ping').length} sent)`
      )
      t.same(
        failures('update').map((s) => s.answer?.status ?? s.error),
        [],
        `no update without a key failed (${sent.filter((s) => s.kind === 'update').length} sent)`
      )

      // Not only 200: counted again (a limit failing open answers without RateLimit).
      const uncounted = sent.filter(
        (s) => s.sentAt >= switched.at + 5_000 && s.answer?.headers['ratelimit'] === undefined
      )
      t.same(
        uncounted.map((s) => `${s.kind} via gateway ${s.gateway}, ${s.sentAt - switched.at} ms after +switch-master`),
        [],
        'every request sent 5 s after +switch-master is counted again'
      )
      const creates = sent.filter((s) => s.kind === 'create')
      const refused = creates.filter((s) => s.answer?.status === 503)
      t.same(
        [...new Set(creates.map((s) => s.answer?.status ?? s.error))].sort(),
        refused.length > 0 ? [200, 503] : [200],
        'keyed creates: 200 or 503, nothing else'
      )
      t.ok(refused.length > 0, 'keyed creates were refused while no master answered')
      for (const r of refused) {
        if (
          !RETRY_AFTER.test(String(r.answer!.headers['retry-after'])) ||
          JSON.stringify(r.answer!.json) !== '{"error":"idempotency store unavailable, retry later"}'
        ) {
          t.fail(
            `a 503 without Retry-After or with another body: ${JSON.stringify(r.answer!.headers)} ${r.answer!.text}`
          )
          break
        }
      }
      const late = refused.filter((s) => s.sentAt >= switched.at + 5_000)
      t.same(
        late.map((s) => s.sentAt - switched.at),
        [],
        'no keyed create sent 5 s after +switch-master was refused'
      )
      t.ok(creates.filter((s) => s.sentAt >= switched.at + 5_000).length > 0, 'and creates were sent then')
      const firstOk = creates
        .filter((s) => s.answer?.status === 200 && s.sentAt > killAt)
        .sort((x, y) => x.doneAt - y.doneAt)[0]
      t.ok(firstOk !== undefined, 'creates went through again after the failover')

      // Every key retried, on the other gateway: a 200 is replayed byte for
      // byte; a refused create now goes through once, then is replayed. A create
      // in flight when the primary died may have left only its claim (the
      // record was not stored, or the claim was stored but its answer lost): the
      // claim, replicated, holds the key (409) until it expires, and the engine
      // deduplicates after that (DECISIONS 16, 26).
      const inFlightAtKill = new Set(creates.filter((s) => s.sentAt < killAt && s.doneAt >= killAt).map((s) => s.key))
      const wrong: string[] = []
      const held: string[] = []
      const portfolios = new Map<string, string>()
      const idOf = (a: Answer): string => (a.json as { portfolio_id: string }).portfolio_id
      for (const s of creates) {
        const key = s.key!
        const retry = await create(gateways[1 - s.gateway]!.url, key, s.token)
        if (
          retry.status === 409 &&
          inFlightAtKill.has(key) &&
          (retry.json as { error?: { code?: string } }).error?.code === 'IDEMPOTENCY_KEY_IN_USE'
        ) {
          held.push(key)
          if (s.answer?.status === 200) portfolios.set(key, idOf(s.answer))
        } else if (s.answer?.status === 200) {
          if (retry.status !== 200 || retry.headers['idempotent-replayed'] !== 'true' || retry.text !== s.answer.text) { wrong.push(`${key}: ${retry.status} replayed=${String(retry.headers['idempotent-replayed'])} ${retry.text}`) }
          portfolios.set(key, idOf(s.answer))
        } else {
          const again = await create(gateways[s.gateway]!.url, key, s.token)
          if (
            retry.status !== 200 ||
            retry.headers['idempotent-replayed'] !== undefined ||
            again.headers['idempotent-replayed'] !== 'true' ||
            again.text !== retry.text
          ) {
            wrong.push(
              `${key} (refused before): ${retry.status} replayed=${String(retry.headers['idempotent-replayed'])}, again ${again.status} replayed=${String(again.headers['idempotent-replayed'])}`
            )
          } else portfolios.set(key, idOf(retry))
        }
      }
      t.same(wrong, [], `every create retried after the failover is replayed (${creates.length} keys)`)

      // At the engine: one portfolio per key (and the setup's), none created twice, no key forwarded twice.
      t.equal(new Set(portfolios.values()).size, portfolios.size, 'each key names its own portfolio')
      await engine.waitFor(CREATED, portfolios.size + 1)
      t.equal(engine.count(CREATED), portfolios.size + 1, 'the engine created each portfolio once')
      t.equal(engine.count(REPEATED), 0, 'no key reached the engine twice')

      const lag: string[] = []
      for (const gw of gateways) {
        const { samples } = await scrape(gw.metricsUrl)
        t.equal(valueOf(samples, 'gateway_redis_up'), 1, 'gateway_redis_up 1 again')
        t.ok((valueOf(samples, 'gateway_redis_failovers_total') ?? 0) >= 1, 'the role change is counted')
        // The promoted master has no replica: its records are counted as unreplicated (DECISIONS 26).
        const unreplicated = valueOf(samples, 'gateway_redis_replication_lag_total', { reason: 'unreplicated' }) ?? 0
        t.ok(unreplicated >= 1, 'records on the lone new master are counted as unreplicated')
        lag.push(
          `missed ${String(valueOf(samples, 'gateway_redis_replication_lag_total', { reason: 'missed' }))}, unreplicated ${unreplicated}`
        )
      }

      // A failure explains itself: what each gateway logged about Redis.
      if (!t.passing()) {
        for (const [i, gw] of gateways.entries()) {
          t.comment(
            `gateway ${i}:\n${gw
              .out()
              .split('\n')
              .filter((l) => /"msg":"redis /.test(l))
              .slice(-25)
              .join('\n')}`
          )
        }
      }

      // The figures docs/operations.md quotes: what the failover cost.
      const firstRefused = Math.min(...refused.map((s) => s.sentAt))
      const lastRefused = Math.max(...refused.map((s) => s.doneAt))
      t.comment(
        `failover figures: +switch-master ${switched.at - killAt} ms after the SIGKILL; keyed creates refused (503) ` +
          `for ${lastRefused - firstRefused} ms (${refused.length} of ${creates.length} creates; ${sent.length - creates.length} pings and updates, none failed); ` +
          `first 200 ${firstOk!.doneAt - switched.at} ms after +switch-master; ${inFlightAtKill.size} creates in flight at the kill, ${held.length} of them held by their claim on retry; ` +
          `gateway_redis_replication_lag_total per gateway: ${lag.join('; ')}`
      )
    }
  )
}
