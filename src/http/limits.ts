import type { GatewayConfig } from '../config.js'

/** Server-side limits (the client's side of "bounded time and memory"). */
export const SERVER_LIMITS = Object.freeze({
  /** Whole request, headers to last body byte: a phone uploading 10 MiB gets three minutes. */
  requestTimeoutMs: 180_000,
  /** Request line and headers: a slow-loris client is cut off after this. */
  headersTimeoutMs: 10_000,
  /** Node's default check every 30 s made a 10 s limit mean 10-40 s. */
  connectionsCheckingIntervalMs: 1_000,
  /** Above the upload stall limit, so a stalled engine is answered with a 504 before the socket is dropped. */
  connectionTimeoutMs: 60_000,
  /** Above common load balancer idle timeouts (60 s), so the balancer closes first. */
  keepAliveTimeoutMs: 72_000,
  bodyLimitBytes: 64 * 1024,
  uploadStallTimeoutMs: 30_000,
  /** Above haproxy's 101 and what a balancer adds: a request a balancer passes is never refused for its count. */
  maxHeaderCount: 128
})

/** While the engine thinks the client's socket is idle, so its limit is never shorter than that wait. */
export function idleTimeoutMs (config: GatewayConfig): number {
  return Math.max(SERVER_LIMITS.connectionTimeoutMs, config.upstreamTimeoutMs + 5_000)
}
