/** The three error bodies of the interface (spec "Errors"), and nothing else. */
import { Type, type Static } from '@sinclair/typebox'

/** 401 on bearer endpoints, 502/504 for engine failures, unknown routes. */
export const SimpleError = Type.Object({
  error: Type.String()
}, { $id: 'SimpleError', additionalProperties: false })
export type SimpleError = Static<typeof SimpleError>

/** 400 and 500 on create and update; the engine's own errors use it too. */
export const StructuredError = Type.Object({
  success: Type.Literal(false),
  error: Type.Object({
    source: Type.String(),
    code: Type.String(),
    message: Type.String(),
    function: Type.String()
  }, { additionalProperties: false })
}, { $id: 'StructuredError', additionalProperties: false })
export type StructuredError = Static<typeof StructuredError>

/** 500 on /health. */
export const HealthError = Type.Object({
  status: Type.Literal('error'),
  message: Type.String()
}, { $id: 'HealthError', additionalProperties: false })
export type HealthError = Static<typeof HealthError>
