/** Headers as the OpenAPI document describes them; the gateway's own readers are stricter where they must be. */
import { Type } from '@sinclair/typebox'

export const RequestIdHeader = Type.String({
  minLength: 1,
  maxLength: 128,
  pattern: '^[\\x21-\\x7e]+$',
  description: 'Kept when 1-128 visible ASCII characters, otherwise replaced by a UUID; ' +
    'echoed on every answer and sent to the engine'
})

export const TraceParentHeader = Type.String({
  pattern: '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-.*)?$',
  maxLength: 512,
  description: 'W3C Trace Context. A valid one is continued (same trace id, the gateway as parent span); ' +
    'anything else starts a new trace'
})

/**
 * Exactly what src/limits/idempotency.ts accepts: 1-255 visible ASCII characters bare (not beginning with a
 * double quote), or 1-255 such characters other than the double quote, in double quotes.
 */
export const IdempotencyKeyHeader = Type.String({
  minLength: 1,
  maxLength: 257,
  pattern: '^(?:[\\x21\\x23-\\x7e][\\x21-\\x7e]{0,254}|"[\\x21\\x23-\\x7e]{1,255}")$',
  description: 'draft-ietf-httpapi-idempotency-key-header: 1-255 visible ASCII characters, bare, or in double quotes ' +
    '(which are not part of the key). A retry with the same key and request gets the stored answer ' +
    '(Idempotent-Replayed: true)'
})

/** Any value is accepted; one that RequestIdHeader does not fit is replaced. */
export const RequestIdParameter = Type.String({
  description: 'Your id for the request: kept when 1-128 visible ASCII characters, otherwise replaced by a new ' +
    'UUID; echoed on every answer and sent to the engine'
})

/** Any value is accepted; one TraceParentHeader does not fit starts a new trace. */
export const TraceParentParameter = Type.String({
  description: 'W3C Trace Context. A valid one is continued (same trace id, the gateway as parent span); ' +
    'anything else starts a new trace'
})

export const RetryAfterHeader = Type.Integer({ minimum: 0, description: 'Seconds to wait before trying again' })
