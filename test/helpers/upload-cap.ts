/**
 * What the upload-cap tests share (DECISIONS 23): slow creates stopped at
 * teardown, a whole small create, a steady pace above the minimum rate, and a
 * TCP path to Redis that a test can cut while Redis keeps what it holds.
 */
import { randomUUID } from 'node:crypto'
import { createServer, connect, type AddressInfo, type Socket } from 'node:net'
import type { Test } from 'tap'
import type { Redis } from 'ioredis'
import { hs256, validUpdate } from './app.js'
import { attemptUntil } from './engine.js'
import { update } from './redis-gateways.js'
import { slowCreate, type Answer, type SlowCreate } from './slow-upload.js'

export const TOO_MANY = { error: 'at most 2 uploads per user at once' }

/** Stops every slow create a test opened, so no socket outlives it. */
export function opened (t: Test): (c: SlowCreate) => SlowCreate {
  const list: SlowCreate[] = []
  t.teardown(() => {
    for (const c of list) c.stop()
  })
  return (c) => {
    list.push(c)
    return c
  }
}

/** A whole small create, sent at once: its answer. */
export async function createNow (url: string, sub: string): Promise<Answer> {
  const c = slowCreate(url, sub, { kind: 'hold' }, 8 * 1024)
  c.finish()
  return await c.answer
}

/** A create that streams for minutes at 8 KiB/s: above the minimum rate, so it is never cut off. */
export const STEADY = { kind: 'steady', bytesPerS: 8 * 1024, everyMs: 200 } as const

/**
 * A TCP path to Redis the test can cut: every connection through it is
 * destroyed and new ones refused, while Redis itself (and what it holds) stays.
 */
export async function cuttablePath (
  t: Test,
  port: number
): Promise<{ url: string; cut: () => void; restore: () => void }> {
  let cut = false
  const sockets = new Set<Socket>()
  const server = createServer((client) => {
    if (cut) return client.destroy()
    const upstream = connect(port, '127.0.0.1')
    for (const s of [client, upstream]) {
      sockets.add(s)
      s.on('close', () => sockets.delete(s))
      s.on('error', () => {})
    }
    client.pipe(upstream).pipe(client)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => {
    for (const s of sockets) s.destroy()
    server.close()
  })
  return {
    url: `redis://127.0.0.1:${(server.address() as AddressInfo).port}`,
    cut: () => {
      cut = true
      for (const s of sockets) s.destroy()
    },
    restore: () => {
      cut = false
    }
  }
}

/** Keyed updates until one is answered 200: the gateway reaches Redis (keyed requests fail closed until then). */
export async function untilServing (url: string): Promise<void> {
  await attemptUntil(
    async () => await update(url, validUpdate(), { key: `ready-${randomUUID()}`, token: hs256({ sub: 'readiness' }) }),
    (r) => r.status === 200,
    15_000
  )
}

/** Two creates of `sub` held open, once both hold their lease in Redis. */
export async function twoHeld (t: Test, url: string, probe: Redis, sub: string): Promise<SlowCreate[]> {
  const track = opened(t)
  const held = [track(slowCreate(url, sub, { kind: 'hold' })), track(slowCreate(url, sub, { kind: 'hold' }))]
  t.equal(
    await attemptUntil(async () => await probe.zcard(`pgw:up:{${sub}}`), (count) => count === 2, 10_000),
    2,
    'two leases'
  )
  return held
}
