/**
 * The listener's part of a graceful close. Node's
 * `http.Server.close()` also ends every idle connection at once, and a
 * connection accepted a moment ago is idle until its request is parsed: a
 * request already on its way was lost that way (15-41 in 65,000 under load).
 * So: stop accepting first, and give the open connections a short grace.
 * While draining each answer says `connection: close` (the gateway's
 * http/connection-close.ts, the reference engine's onSend hook), so a busy
 * connection ends after its next answer; one that stays idle for the whole
 * grace carried nothing, and app.close() then ends it. Shared by the gateway
 * (server.ts) and the standalone engine (DECISIONS 25).
 */
import { once } from 'node:events'
import { Server as NetServer } from 'node:net'
import type { Server } from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'

export async function stopAccepting (server: Server, graceMs: number): Promise<void> {
  if (!server.listening) return
  const drained = once(server, 'close') // emitted once the last connection has ended
  NetServer.prototype.close.call(server) // net's close: no closeIdleConnections
  const grace = new AbortController()
  await Promise.race([drained, sleep(graceMs, undefined, { signal: grace.signal }).catch(() => {})])
  grace.abort()
}
