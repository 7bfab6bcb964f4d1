/**
 * `http.Server.close()` ends idle connections at once, and a connection just accepted is idle until its request is
 * parsed, so that request would be lost: stop accepting first and give open connections a grace
 * (decision: the engine drains too).
 */
import { once } from 'node:events'
import { Server as NetServer } from 'node:net'
import type { Server } from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'

export async function stopAccepting (server: Server, graceMs: number): Promise<void> {
  if (!server.listening) return
  const drained = once(server, 'close')
  NetServer.prototype.close.call(server) // net's close: no closeIdleConnections
  const grace = new AbortController()
  await Promise.race([drained, sleep(graceMs, undefined, { signal: grace.signal }).catch(() => {})])
  grace.abort()
}
