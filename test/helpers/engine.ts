/**
 * Starts a reference engine on a real socket for one test, in a fresh image
 * directory, and closes it (and the test's HTTP client) in teardown.
 */
import type { AddressInfo } from 'node:net'
import type { Test } from 'tap'
import { Agent, request } from 'undici'
import { buildEngine, type EngineOptions } from '../../src/reference-engine/engine.js'

export const USER = 'user-alice'
export const OTHER_USER = 'user-bob'
/** Valid Solana addresses (wrapped SOL, USDC, system program). */
export const MINTS = ['So11111111111111111111111111111111111111112', 'EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v', '11111111111111111111111111111111'] as const

export interface CallOptions {
  method?: 'GET' | 'POST'
  headers?: Record<string, string>
  body?: string | Buffer
}

export async function startEngine (t: Test, opts: Partial<EngineOptions> = {}) {
  const imageDir = opts.imageDir ?? t.testdir({})
  const engine = await buildEngine({ ...opts, imageDir })
  await engine.listen({ port: 0, host: '127.0.0.1' })
  const { port } = engine.server.address() as AddressInfo
  const origin = `http://127.0.0.1:${port}`
  // Short keep-alive so teardown never waits on an idle socket.
  const dispatcher = new Agent({ keepAliveTimeout: 10, keepAliveMaxTimeout: 10 })
  t.teardown(async () => {
    await dispatcher.close()
    await engine.close()
  })

  async function call (path: string, options: CallOptions = {}) {
    const res = await request(origin + path, { dispatcher, method: options.method ?? 'GET', headers: options.headers ?? {}, body: options.body ?? null })
    const text = await res.body.text()
    const type = String(res.headers['content-type'] ?? '')
    return { status: res.statusCode, type, text, json: type.startsWith('application/json') ? JSON.parse(text) as unknown : undefined }
  }

  /** POST JSON to /api/portfolio/update as `user`. */
  async function update (body: unknown, user: string = USER) {
    return await call('/api/portfolio/update', { method: 'POST', headers: { 'content-type': 'application/json', 'x-user-id': user }, body: JSON.stringify(body) })
  }

  return { engine, origin, port, imageDir, call, update }
}

/** Retry `check` until it holds or `ms` passes: cleanup after a disconnect is asynchronous. */
export async function eventually (check: () => boolean, ms = 2000): Promise<boolean> {
  const deadline = Date.now() + ms
  while (Date.now() < deadline) {
    if (check()) return true
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
  return check()
}

export { attemptUntil } from './until.js'
