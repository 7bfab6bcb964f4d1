/**
 * A Kubernetes rolling update as the gateway sees it through DNS: reference
 * engines (real processes, one Redis shared) on distinct loopback addresses
 * (127.0.0.2, 127.0.0.3, ... on one port) behind one name, served by an
 * injected lookup that this helper changes. Under a steady, bounded load of
 * pings and updates, each old engine is replaced as a Deployment with
 * maxSurge 1, maxUnavailable 0 does it: a new pod is started and added to the
 * name once ready; then an old one is removed from the name and gets SIGTERM
 * at the same moment (it drains, DECISIONS 25). Twice.
 *
 * Used by test/engine-client/rollout.test.ts, and by bench/rollout-dns.ts for the
 * before/after figures (it needs nothing the gateway did not have before).
 */
import { once } from 'node:events'
import type { Test } from 'tap'
import { request } from 'undici'
import { bearer, build, MINTS } from './app.js'
import { newImageDir } from './engine-process.js'
import { multipartBody } from './multipart.js'
import { ENGINE_SCRIPT, freePort, startProcess, type Proc } from './processes.js'
import { startRedis } from './redis.js'

export interface RolloutOptions {
  /** The gateway's DNS refresh; unset: its default. */
  refreshMs?: number
  /** Active health-check interval. */
  healthMs: number
  /** The engines' drain notice (ENGINE_DRAIN_NOTICE_MS). */
  noticeMs: number
  /** Load: this many workers, each waiting pauseMs between its requests. */
  workers: number
  pauseMs: number
  /** Between a new engine joining the name and an old one leaving it (minReadySeconds, scaled). */
  surgeMs: number
  /** How long the load goes on after the last old engine has exited. */
  afterMs: number
}

export interface Outcome {
  kind: 'ping' | 'update'
  start: number
  end: number
  status: number
}

export interface RolloutResult {
  outcomes: Outcome[]
  /** Non-200 answers, with their bodies. */
  failures: string[]
  /** performance.now() of each step, for reading the outcomes against. */
  steps: Array<{ what: string; at: number }>
  /** How each old engine ended: [code, signal]. */
  exits: Array<[number | null, NodeJS.Signals | null]>
}

type Teardown = Pick<Test, 'teardown'>

const sleep = async (ms: number): Promise<void> => {
  await new Promise((resolve) => setTimeout(resolve, ms))
}

export async function rollout (t: Teardown, opts: RolloutOptions): Promise<RolloutResult> {
  const redis = await startRedis(t as Test)
  const port = await freePort()
  const dir = newImageDir(t as Test)
  const engineAt = async (host: string): Promise<Proc> =>
    await startProcess(
      t as Test,
      ENGINE_SCRIPT,
      {
        NODE_ENV: 'test',
        ENGINE_PORT: String(port),
        ENGINE_HOST: host,
        ENGINE_IMAGE_DIR: dir,
        ENGINE_DRAIN_NOTICE_MS: String(opts.noticeMs),
        ENGINE_REDIS_URL: redis.url
      },
      port,
      /portfolio engine ready/
    )
  const engines = new Map<string, Proc>()
  for (const host of ['127.0.0.2', '127.0.0.3']) engines.set(host, await engineAt(host))
  let answer = [...engines.keys()]
  const lookup = async (name: string): Promise<Array<{ address: string; family: number }>> => {
    if (name !== 'engine.test') throw Object.assign(new Error(`no such name ${name}`), { code: 'ENOTFOUND' })
    return answer.map((address) => ({ address, family: 4 }))
  }
  const { url } = await build(t, {
    upstreamUrl: `http://engine.test:${port}`,
    env: { RATE_LIMIT_PER_MINUTE: '0', UPSTREAM_TIMEOUT_MS: '3000' },
    cluster: {
      lookup,
      health: { intervalMs: opts.healthMs },
      ...(opts.refreshMs === undefined ? {} : { resolveIntervalMs: opts.refreshMs })
    }
  })

  const form = multipartBody([
    { name: 'name', value: 'Rollout' },
    { name: 'type', value: 'PORTFOLIO' }
  ])
  const created = await request(`${url}/api/portfolio/create`, {
    method: 'POST',
    headers: { ...bearer(), 'content-type': form.contentType },
    body: form.body
  })
  const { portfolio_id: id } = (await created.body.json()) as { portfolio_id: string }
  if (created.statusCode !== 200) throw new Error(`create answered ${created.statusCode}`)
  const update = JSON.stringify({
    portfolio_id: id,
    target_positions: [
      { mint: MINTS[0], allocation: 0.5 },
      { mint: MINTS[1], allocation: 0.5 }
    ]
  })

  const outcomes: Outcome[] = []
  const failures: string[] = []
  const steps: RolloutResult['steps'] = []
  let running = true
  const load = Promise.all(
    Array.from({ length: opts.workers }, async (_, w) => {
      for (let i = w; running; i++) {
        const kind = i % 2 === 0 ? 'ping' : 'update'
        const start = performance.now()
        let status = 0
        try {
          const res =
            kind === 'ping'
              ? await request(`${url}/api/portfolio/ping`, { headers: bearer() })
              : await request(`${url}/api/portfolio/update`, {
                  method: 'POST',
                  headers: { ...bearer(), 'content-type': 'application/json' },
                  body: update
                })
          status = res.statusCode
          const text = await res.body.text()
          if (status !== 200) failures.push(`${kind} ${status} ${text}`)
        } catch (err) {
          failures.push(`${kind} ${String(err)}`)
        }
        outcomes.push({ kind, start, end: performance.now(), status })
        await sleep(opts.pauseMs)
      }
    })
  )
  const step = (what: string): void => {
    steps.push({ what, at: performance.now() })
  }

  await sleep(500)
  const exits: RolloutResult['exits'] = []
  for (const [old, fresh] of [
    ['127.0.0.2', '127.0.0.4'],
    ['127.0.0.3', '127.0.0.5']
  ] as const) {
    // The new pod: ready, then in the name (a Service lists ready pods only).
    engines.set(fresh, await engineAt(fresh))
    answer = [...answer, fresh]
    step(`${fresh} added`)
    await sleep(opts.surgeMs)
    // The old pod: out of the name and SIGTERM at the same moment.
    const proc = engines.get(old)!.proc
    const exited = once(proc, 'exit') as Promise<[number | null, NodeJS.Signals | null]>
    answer = answer.filter((a) => a !== old)
    proc.kill('SIGTERM')
    step(`${old} removed and SIGTERM`)
    exits.push(await exited)
    step(`${old} exited`)
  }
  await sleep(opts.afterMs)
  running = false
  await load
  step('load stopped')
  return { outcomes, failures, steps, exits }
}
