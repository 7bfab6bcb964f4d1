/**
 * What makes two requests "the same request" for an Idempotency-Key (DECISIONS
 * 16): the route and the validated content, never the framing. The gateway
 * (limits/idempotency.ts, routes/) and the reference engine (its create
 * deduplication) fingerprint alike, so both answer a reused key the same way.
 */
import { hash } from 'node:crypto'

/** The fingerprint of a request: its route and its canonical validated content. */
export function fingerprintOf (route: string, canonical: string): string {
  // One-shot hash: half the cost of a Hash object on a string this short.
  return hash('sha256', `${route}\n${canonical}`, 'base64url')
}

/**
 * A create form's canonical content: its text fields sorted by name, and the
 * image's SHA-256 (base64url; of no bytes when the form has none). The
 * multipart boundary and the order of the parts do not count.
 */
export function formContent (fields: Iterable<readonly [string, string]>, imageDigest: string): string {
  return JSON.stringify([[...fields].sort(([a], [b]) => (a < b ? -1 : 1)), imageDigest])
}
