/**
 * The server's own limits: bounded time and memory on the client's side.
 */
import type { GatewayConfig } from '../config.js'

/** Server-side limits (the client's side of "bounded time and memory"). */
export const SERVER_LIMITS = Object.freeze({
  /** Whole request, headers to last body byte: a phone uploading 10 MiB gets three minutes. */
  requestTimeoutMs: 180_000,
  /** Request line and headers: a slow-loris client is cut off after this. */
  headersTimeoutMs: 10_000,
  /**
   * How often Node checks the two timeouts above (its default is 30 s, which
   * made 10 s mean 10-40 s): each is enforced within a second of its value.
   */
  connectionsCheckingIntervalMs: 1_000,
  /**
   * Idle socket (no bytes either way), at least: while the engine thinks, the
   * client's socket is idle, so the gateway uses UPSTREAM_TIMEOUT_MS + 5 s when
   * that is longer. Above the upload stall limit, so a stalled engine is
   * answered with a 504 before the client's socket is dropped.
   */
  connectionTimeoutMs: 60_000,
  /** Above common load balancer idle timeouts (60 s), so the balancer closes first. */
  keepAliveTimeoutMs: 72_000,
  bodyLimitBytes: 64 * 1024,
  /** An engine that reads nothing of an upload for this long is given up on. */
  uploadStallTimeoutMs: 30_000,
  /**
   * Above haproxy's 101 (tune.http.maxhdr) and what a balancer adds: a request a balancer passes is never refused
   * for its count. Past it Node 24's parser answers 431 (Node 22 drops the extra headers unread).
   */
  maxHeaderCount: 128
})

/** The client socket's idle limit: never shorter than the wait for the engine. */
export function idleTimeoutMs (config: GatewayConfig): number {
  return Math.max(SERVER_LIMITS.connectionTimeoutMs, config.upstreamTimeoutMs + 5_000)
}
