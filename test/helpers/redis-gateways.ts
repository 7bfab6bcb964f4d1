/**
 * Gateway processes (dist/) on a shared Redis topology, in front of one
 * standalone reference engine, and the client calls the Redis topology tests
 * make through them with undici. The engine logs `portfolio created` once per
 * portfolio and `portfolio create repeated with its idempotency key` when a
 * key reaches it twice (DECISIONS 16): the tests count both there.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Test } from 'tap'
import { Agent, request } from 'undici'
import { PNG_IMAGE } from '../../fixtures/images.js'
import { bearer, hs256, SECRET, validUpdate } from './app.js'
import { multipartBody } from './multipart.js'
import { ENGINE_SCRIPT, ensureBuilt, freePort, GATEWAY_SCRIPT, startProcess, type Proc } from './processes.js'

export interface Answer {
  status: number
  headers: Record<string, string | string[] | undefined>
  text: string
  json: unknown
}

// Short keep-alive, so teardown never waits on an idle socket.
const dispatcher = new Agent({ keepAliveTimeout: 1_000, keepAliveMaxTimeout: 1_000 })

export async function call (
  url: string,
  opts: { method?: 'GET' | 'POST'; headers?: Record<string, string>; body?: string | Buffer } = {}
): Promise<Answer> {
  const res = await request(url, {
    dispatcher,
    method: opts.method ?? 'GET',
    headers: opts.headers ?? {},
    body: opts.body ?? null
  })
  const text = await res.body.text()
  let json: unknown
  try {
    json = JSON.parse(text)
  } catch {
    json = undefined
  }
  return { status: res.statusCode, headers: res.headers, text, json }
}

export const ping = (url: string, token = hs256()): Promise<Answer> =>
  call(`${url}/api/portfolio/ping`, { headers: bearer(token) })

export function update (url: string, body: unknown, opts: { key?: string; token?: string } = {}): Promise<Answer> {
  return call(`${url}/api/portfolio/update`, {
    method: 'POST',
    body: JSON.stringify(body),
    headers: {
      ...bearer(opts.token ?? hs256()),
      'content-type': 'application/json',
      ...(opts.key === undefined ? {} : { 'idempotency-key': opts.key })
    }
  })
}

const png = readFileSync(PNG_IMAGE)

/** A create with a small PNG; `name` changes the request (a reused key with another name is a 422). */
export function create (url: string, key: string, token = hs256(), name = 'Alpha'): Promise<Answer> {
  const form = multipartBody([
    { name: 'name', value: name },
    { name: 'type', value: 'PORTFOLIO' },
    { name: 'image', filename: 'a.png', contentType: 'image/png', data: png }
  ])
  return call(`${url}/api/portfolio/create`, {
    method: 'POST',
    body: form.body,
    headers: { ...bearer(token), 'content-type': form.contentType, 'idempotency-key': key }
  })
}

/** Call until `done` holds (the gateway connects to Redis in the background), at most `ms`. */
export async function until (
  attempt: () => Promise<Answer>,
  done: (a: Answer) => boolean,
  ms = 15_000
): Promise<Answer> {
  const deadline = Date.now() + ms
  for (;;) {
    const answer = await attempt()
    if (done(answer) || Date.now() > deadline) return answer
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

/** Wait until `check` holds (state the test's own load builds up), at most `ms`. */
export async function waitUntil (what: string, check: () => boolean, ms = 20_000): Promise<void> {
  const deadline = Date.now() + ms
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

/** `promise`, or a rejection naming `what` after `ms`; the timer never outlives it. */
export async function within<T> (promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_resolve, reject) => {
        timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms)
      })
    ])
  } finally {
    clearTimeout(timer)
  }
}

export const CREATED = /"msg":"portfolio created"/
export const REPEATED = /"msg":"portfolio create repeated with its idempotency key"/

/** The reference engine as a process, its images in a temporary directory. */
export async function startEngineProcess (t: Test): Promise<Proc> {
  ensureBuilt()
  const imageDir = mkdtempSync(join(tmpdir(), 'redis-topology-engine-'))
  t.teardown(() => rmSync(imageDir, { recursive: true, force: true }))
  return await startProcess(
    t,
    ENGINE_SCRIPT,
    (port) => ({ ENGINE_PORT: String(port), ENGINE_HOST: '127.0.0.1', ENGINE_IMAGE_DIR: imageDir }),
    /portfolio engine ready/
  )
}

export interface Gateway extends Proc {
  metricsUrl: string
}

/**
 * A gateway process in front of `engineUrl` with `env` (the Redis variables,
 * RATE_LIMIT_PER_MINUTE ...), its metrics on a port of its own.
 */
export async function startGateway (t: Test, engineUrl: string, env: Record<string, string>): Promise<Gateway> {
  ensureBuilt()
  // startProcess tries other ports when one was taken before the gateway listened: the metrics port too.
  let metricsPort = 0
  const proc = await startProcess(
    t,
    GATEWAY_SCRIPT,
    async (port) => {
      metricsPort = await freePort()
      return {
        PORT: String(port),
        HOST: '127.0.0.1',
        METRICS_PORT: String(metricsPort),
        JWT_SECRET: SECRET,
        UPSTREAM_URL: engineUrl,
        LOG_LEVEL: 'info',
        // Not a shedding test: on a busy shared runner a descheduled process sees late timers.
        SHED_EVENT_LOOP_DELAY_MS: '0',
        ...env
      }
    },
    /gateway ready/
  )
  return Object.assign(proc, { metricsUrl: `http://127.0.0.1:${metricsPort}` })
}

/**
 * Wait until `gw` counts and claims in Redis: it says `redis connected` once
 * both of its connections (counters, records) are ready, and a keyed update
 * is then not 503 (the engine answers 404 for the unknown portfolio).
 */
export async function untilStoring (gw: Gateway, token = hs256({ sub: 'readiness' })): Promise<void> {
  await gw.waitFor(/"msg":"redis connected"/)
  let n = 0
  const answer = await until(
    () => update(gw.url, validUpdate(), { key: `ready-${n++}`, token }),
    (a) => a.status !== 503
  )
  if (answer.status === 503) throw new Error(`gateway ${gw.url} never reached Redis:\n${gw.out()}`)
}
