/**
 * The rule for a token's `sub`: it travels to the engine as `x-user-id`
 * (DECISIONS 9), so it must be header-safe and short. One rule for the gateway
 * (src/auth/jwt.ts) and the token CLI (src/cli/token.ts), so the CLI never
 * prints a token the gateway refuses.
 */
export const SANE_SUBJECT = /^[\x21-\x7e]{1,256}$/

/** The rule in words, for messages. */
export const SUBJECT_RULE = '1-256 visible ASCII characters (no spaces or control characters)'
