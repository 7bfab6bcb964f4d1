/**
 * A token's `sub` travels to the engine as `x-user-id` (decision: identity), so it must be header-safe and short;
 * the token CLI shares the rule so it never prints a token the gateway refuses.
 */
export const SANE_SUBJECT = /^[\x21-\x7e]{1,256}$/

export const SUBJECT_RULE = '1-256 visible ASCII characters (no spaces or control characters)'
