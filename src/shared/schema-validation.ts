/**
 * One Ajv configuration for the gateway and the reference engine, so a rule in schemas/ is checked alike on both
 * legs (Ajv counts string lengths in code points, TypeBox's compiler in UTF-16 units).
 */
import type { FastifyServerOptions } from 'fastify'
import { ajvFormats } from '../../schemas/formats.js'
import { describeIssues, type SchemaIssue } from './validation-messages.js'

export const SCHEMA_VALIDATION = Object.freeze({
  // No coercion and no dropped fields (decision: strict json); allErrors would let one body make thousands of issues.
  customOptions: { coerceTypes: false, removeAdditional: false, useDefaults: false, allErrors: false },
  plugins: [ajvFormats]
}) satisfies FastifyServerOptions['ajv']

export type CompiledSchema = ((data: unknown) => boolean) & { errors?: unknown }

/** `root` names the whole value in the message. */
export function schemaProblem (validate: CompiledSchema, data: unknown, root: string): string | undefined {
  if (validate(data)) return undefined
  return describeIssues((validate.errors ?? []) as SchemaIssue[], root)
}
