/**
 * Two requests are the same for an Idempotency-Key by route and validated content, never framing (decision:
 * idempotency); the reference engine fingerprints alike, so both answer a reused key the same way.
 */
import { hash } from 'node:crypto'

export function fingerprintOf (route: string, canonical: string): string {
  return hash('sha256', `${route}\n${canonical}`, 'base64url')
}

/** Fields sorted by name and the image's digest, so the boundary and the order of the parts do not count. */
export function formContent (fields: Iterable<readonly [string, string]>, imageDigest: string): string {
  return JSON.stringify([[...fields].sort(([a], [b]) => (a < b ? -1 : 1)), imageDigest])
}
