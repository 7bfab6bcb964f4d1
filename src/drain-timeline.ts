/**
 * The gateway's shutdown timeline (server.ts; DECISIONS 12 and 25), apart from
 * server.ts's side effects so the deployment recipe's grace periods can be
 * checked against the numbers the code uses (test/deploy/timelines.test.ts).
 */
export const GATEWAY_DRAIN = Object.freeze({
  /** In production /health answers 500 this long before the listener closes; development closes at once. */
  productionNoticeMs: 5_000,
  /** After the listener stops accepting, how long open connections get to send their last request. */
  idleGraceMs: 1_000,
  /**
   * close-with-grace's delay. It counts from the signal, so the process exits
   * at the latest this long after SIGTERM, the notice included: requests in
   * flight when the listener closes get what is left of it (20 s in production).
   */
  exitDeadlineMs: 25_000
})
