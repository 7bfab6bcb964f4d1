/** The shutdown timeline, free of side effects so the deployment recipe's grace periods are checked against it. */
export const GATEWAY_DRAIN = Object.freeze({
  /** In production /health answers 500 this long before the listener closes; development closes at once. */
  productionNoticeMs: 5_000,
  idleGraceMs: 1_000,
  /** Counted from the signal, the notice included: requests in flight at the close get what is left of it. */
  exitDeadlineMs: 25_000
})
