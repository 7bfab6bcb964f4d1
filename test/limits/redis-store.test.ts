/**
 * Shared state in a real Redis (DECISIONS 17): in process, and as two gateway
 * processes on one Redis in front of one standalone reference engine. Redis
 * is killed and restarted mid-test.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Redis } from 'ioredis'
import t from 'tap'
import { request } from 'undici'
import { PNG_IMAGE } from '../../fixtures/images.js'
import { startStubUpstream } from '../../fixtures/stub-upstream.js'
import { metricOf } from '../helpers/prometheus.js'
import { bearer, build, hs256, MINTS, SECRET, validUpdate } from '../helpers/app.js'
import { clearOfWindowEdge } from '../helpers/window.js'
import { multipartBody } from '../helpers/multipart.js'
import { ENGINE_SCRIPT, ensureBuilt, freePort, GATEWAY_SCRIPT, startProcess, type Proc } from '../helpers/processes.js'
import { attemptUntil } from '../helpers/engine.js'
import { commandCounts, requireRedis, startRedis } from '../helpers/redis.js'

interface Answer {
  status: number
  headers: Record<string, string | string[] | undefined>
  text: string
  json: unknown
}

async function call (
  url: string,
  opts: { method?: 'GET' | 'POST'; headers?: Record<string, string>; body?: string | Buffer } = {}
): Promise<Answer> {
  const res = await request(url, { method: opts.method ?? 'GET', headers: opts.headers ?? {}, body: opts.body ?? null })
  const text = await res.body.text()
  let json: unknown
  try {
    json = JSON.parse(text)
  } catch {
    json = undefined
  }
  return { status: res.statusCode, headers: res.headers, text, json }
}

const update = (url: string, body: unknown, key?: string, token = hs256()) =>
  call(`${url}/api/portfolio/update`, {
    method: 'POST',
    body: JSON.stringify(body),
    headers: {
      ...bearer(token),
      'content-type': 'application/json',
      ...(key === undefined ? {} : { 'idempotency-key': key })
    }
  })

const png = readFileSync(PNG_IMAGE)

// Two counts that must fall in one rate-limit window may each wait out the end of one (up to 15 s and
// 10 s, clearOfWindowEdge) on top of two gateway processes and a Redis killed and restarted.
t.setTimeout(120_000)

function create (url: string, key: string, token = hs256()): Promise<Answer> {
  const form = multipartBody([
    { name: 'name', value: 'Alpha' },
    { name: 'type', value: 'PORTFOLIO' },
    { name: 'image', filename: 'a.png', contentType: 'image/png', data: png }
  ])
  return call(`${url}/api/portfolio/create`, {
    method: 'POST',
    body: form.body,
    headers: { ...bearer(token), 'content-type': form.contentType, 'idempotency-key': key }
  })
}

/** Call until `done` holds (Redis reconnects in the background), at most 10 s. */
const until = async (attempt: () => Promise<Answer>, done: (a: Answer) => boolean): Promise<Answer> =>
  await attemptUntil(attempt, done, 10_000)

if (requireRedis(t)) {
  t.test(
    'in process: counters and records in Redis; Redis down fails rate limits open and keyed requests closed; it recovers',
    async (t) => {
      const redis = await startRedis(t)
      const stub = await startStubUpstream()
      t.teardown(() => stub.close())
      const { metrics, url } = await build(t, {
        upstreamUrl: stub.url,
        env: { REDIS_URL: redis.url, RATE_LIMIT_PER_MINUTE: '2' }
      })
      const ping = () => call(`${url}/api/portfolio/ping`, { headers: bearer() })

      // The connect, two pings and the refusal within one window.
      await clearOfWindowEdge(15_000)
      const first = await until(ping, (a) => a.headers['ratelimit'] !== undefined) // the first connect is in the background
      t.equal(first.status, 200)

      // Cheap rejections stay cheap: a flood of bad tokens costs no Redis command.
      const probe = new Redis(redis.url)
      probe.on('error', () => {}) // Redis is killed below
      t.teardown(() => probe.disconnect())
      const before = await commandCounts(probe)
      for (let i = 0; i < 20; i++) {
        t.equal(
          (
            await call(`${url}/api/portfolio/ping`, {
              headers: bearer(hs256({}, 'not-the-secret-not-the-secret-not-the-s'))
            })
          ).status,
          401
        )
      }
      t.same(await commandCounts(probe), before, '20 bad tokens, not one Redis command')
      t.equal((await ping()).status, 200)
      t.equal(
        (await commandCounts(probe))['incrby'],
        (before['incrby'] ?? 0) + 1,
        'a verified request is counted once (one INCRBY, in the script of its turn)'
      )
      t.match(first.headers['ratelimit'], /^"default";r=1;t=\d+$/)
      const refused = await ping()
      t.equal(refused.status, 429)
      t.same(refused.json, { error: 'rate limit exceeded' })

      const stored = await update(url, validUpdate(), 'r-1', hs256({ sub: 'carol' }))
      t.equal(stored.status, 200)
      const replay = await update(url, validUpdate(), 'r-1', hs256({ sub: 'carol' }))
      t.equal(replay.headers['idempotent-replayed'], 'true')
      t.equal(replay.text, stored.text)

      await redis.kill()
      // Pings before the first connect went through unlimited too: count from here.
      const openBefore = (await metricOf(metrics, 'gateway_rate_limit_fail_open_total')) ?? NaN
      const open = await ping()
      t.equal(open.status, 200, 'rate limit fails open')
      t.equal(open.headers['ratelimit'], undefined)
      t.equal(await metricOf(metrics, 'gateway_rate_limit_fail_open_total'), openBefore + 1, 'and is counted')
      const closed = await update(url, validUpdate(), 'r-2')
      t.equal(closed.status, 503, 'a keyed request fails closed')
      t.same(closed.json, { error: 'idempotency store unavailable, retry later' })
      t.equal(closed.headers['retry-after'], '1')
      t.equal(
        await metricOf(metrics, 'gateway_idempotency_total', { outcome: 'store_unavailable' }),
        1,
        'and is counted'
      )
      t.equal((await update(url, validUpdate())).status, 200, 'a request without a key is unaffected')

      await redis.restart()
      const back = await until(
        () => update(url, validUpdate(), 'r-2'),
        (a) => a.status !== 503
      )
      t.equal(back.status, 200, 'recovers once Redis is back')
      t.match((await ping()).headers['ratelimit'], /^"default";r=\d+;t=\d+$/, 'counting again')
    }
  )

  t.test('two gateway processes on one Redis behave as one', async (t) => {
    ensureBuilt()
    const redis = await startRedis(t)
    const imageDir = mkdtempSync(join(tmpdir(), 'redis-test-engine-'))
    t.teardown(() => rmSync(imageDir, { recursive: true, force: true }))
    const enginePort = await freePort()
    const engine = await startProcess(
      t,
      ENGINE_SCRIPT,
      { ENGINE_PORT: String(enginePort), ENGINE_HOST: '127.0.0.1', ENGINE_IMAGE_DIR: imageDir },
      enginePort,
      /portfolio engine ready/
    )
    const gatewayEnv = (port: number): Record<string, string> => ({
      PORT: String(port),
      HOST: '127.0.0.1',
      METRICS_PORT: '0',
      JWT_SECRET: SECRET,
      UPSTREAM_URL: engine.url,
      REDIS_URL: redis.url,
      RATE_LIMIT_PER_MINUTE: '12',
      LOG_LEVEL: 'info',
      // Not a shedding test: on a busy shared runner a descheduled process sees late timers.
      SHED_EVENT_LOOP_DELAY_MS: '0',
      // Ten creates of one user at once below: an idempotency test, not one of the per-user upload cap (DECISIONS 23).
      UPLOAD_MAX_PER_USER: '10'
    })
    const startGateway = async (): Promise<Proc> => {
      const port = await freePort()
      return await startProcess(t, GATEWAY_SCRIPT, gatewayEnv(port), port, /gateway ready/)
    }
    const [a, b] = await Promise.all([startGateway(), startGateway()])
    await Promise.all([a.waitFor(/redis connected/), b.waitFor(/redis connected/)])
    const created = /"msg":"portfolio created"/

    t.test("one user's limit holds across both", async (t) => {
      const token = hs256({ sub: 'limited' })
      await clearOfWindowEdge()
      const seen: string[] = []
      for (const gw of [a, b, a, b, a, b, a, b, a, b, a, b]) {
        const res = await call(`${gw.url}/api/portfolio/ping`, { headers: bearer(token) })
        t.equal(res.status, 200, res.text)
        seen.push(String(res.headers['ratelimit']).replace(/;t=\d+$/, ''))
      }
      t.same(
        seen,
        [11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0].map((r) => `"default";r=${r}`),
        'one counter for both instances'
      )
      for (const gw of [a, b]) {
        const res = await call(`${gw.url}/api/portfolio/ping`, { headers: bearer(token) })
        t.equal(res.status, 429)
        t.same(res.json, { error: 'rate limit exceeded' })
      }
    })

    let portfolioId = ''
    t.test('a create retried on the other instance is replayed: one portfolio', async (t) => {
      const first = await create(a.url, 'two-1')
      t.equal(first.status, 200)
      portfolioId = (first.json as { portfolio_id: string }).portfolio_id
      const retry = await create(b.url, 'two-1')
      t.equal(retry.status, 200)
      t.equal(retry.headers['idempotent-replayed'], 'true')
      t.equal(retry.text, first.text, 'the same portfolio_id, byte for byte')
      await engine.waitFor(created, 1)
      t.equal(engine.count(created), 1, 'the engine created one portfolio')
    })

    t.test('ten concurrent identical creates with one key make exactly one portfolio', async (t) => {
      const ten = hs256({ sub: 'ten-creates' })
      const answers = await Promise.all(
        Array.from({ length: 10 }, (_, i) => create(i % 2 === 0 ? a.url : b.url, 'two-10', ten))
      )
      const ok = answers.filter((r) => r.status === 200)
      t.ok(ok.length >= 1, 'one of them went through')
      // The upload cap (2 per user, DECISIONS 23) holds across both gateways: a create past it is 429 before its
      // claim.
      t.same(
        answers.map((r) => r.status).filter((status) => ![200, 409, 429].includes(status)),
        [],
        'the rest: in flight (409) or over the upload cap (429)'
      )
      t.equal(new Set(ok.map((r) => r.text)).size, 1, 'every 200 names the same portfolio')
      const after = await create(b.url, 'two-10', ten)
      t.equal(after.headers['idempotent-replayed'], 'true')
      t.equal(after.text, ok[0]!.text)
      await engine.waitFor(created, 2)
      t.equal(engine.count(created), 2, 'the engine created one more portfolio, not ten')
    })

    t.test(
      'Redis killed: rate limits fail open, keyed requests 503, the rest unaffected; restarted: both recover',
      async (t) => {
        await redis.kill()
        const token = hs256({ sub: 'limited' }) // over its limit while Redis was up
        for (const gw of [a, b]) {
          const ping = await call(`${gw.url}/api/portfolio/ping`, { headers: bearer(token) })
          t.equal(ping.status, 200, 'fail open')
          const keyed = await update(
            gw.url,
            { portfolio_id: portfolioId, target_positions: [{ mint: MINTS[0], allocation: 1 }] },
            'down-1'
          )
          t.equal(keyed.status, 503)
          t.same(keyed.json, { error: 'idempotency store unavailable, retry later' })
          t.equal(keyed.headers['retry-after'], '1')
          const plain = await update(gw.url, {
            portfolio_id: portfolioId,
            target_positions: [{ mint: MINTS[0], allocation: 1 }]
          })
          t.equal(plain.status, 200, 'without a key: unaffected')
        }
        // A new instance starts while Redis is down.
        const c = await startGateway()
        t.equal((await call(`${c.url}/api/portfolio/ping`, { headers: bearer() })).status, 200)
        await c.waitFor(/redis unavailable/)
        t.equal(c.count(/redis unavailable/), 1, 'says so once, not once per reconnect attempt')

        await redis.restart()
        // The limit (12 a minute) counts again as soon as Redis answers, and the idempotency store
        // may reconnect later: 50 ms retries by the portfolio's owner would spend the owner's limit
        // (seen: 429 on the third gateway). So wait with a user of its own per attempt (whose
        // update of a foreign portfolio is 404 once the store answers), then update as the owner once.
        let attempt = 0
        for (const gw of [a, b, c]) {
          const probe = await until(
            () => {
              attempt += 1
              return update(
                gw.url,
                { portfolio_id: portfolioId, target_positions: [{ mint: MINTS[1], allocation: 1 }] },
                `probe-${attempt}`,
                hs256({ sub: `recovering-${attempt}` })
              )
            },
            (r) => r.status !== 503
          )
          t.equal(probe.status, 404, 'the idempotency store answers again')
          const back = await update(
            gw.url,
            { portfolio_id: portfolioId, target_positions: [{ mint: MINTS[1], allocation: 1 }] },
            `up-${gw.url}`
          )
          t.equal(back.status, 200, 'recovered')
          t.match(
            (await call(`${gw.url}/api/portfolio/ping`, { headers: bearer() })).headers['ratelimit'],
            /^"default";r=\d+;t=\d+$/
          )
        }
      }
    )
  })
}
