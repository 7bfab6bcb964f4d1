/**
 * One schema compiler configuration for the gateway and the reference engine
 *: both are Fastify instances built with these Ajv options,
 * so a rule in schemas/ is checked the same way on both legs. In particular
 * Ajv counts string lengths in code points, where TypeBox's compiler counts
 * UTF-16 code units: a name of 30 emoji is 30 characters on both sides.
 */
import type { FastifyServerOptions } from 'fastify'
import { ajvFormats } from '../../schemas/formats.js'
import { describeIssues, type SchemaIssue } from './validation-messages.js'

/** Fastify's `ajv` option, for both servers. */
export const SCHEMA_VALIDATION = Object.freeze({
  // DECISIONS 6: no coercion ("0.5" is not a number), unknown fields are errors, not dropped.
  // allErrors stays off: with it, one body can make Ajv report (and us format) thousands of issues.
  customOptions: { coerceTypes: false, removeAdditional: false, useDefaults: false, allErrors: false },
  plugins: [ajvFormats]
}) satisfies FastifyServerOptions['ajv']

/** What `request.compileValidationSchema` returns: Ajv's validate function. */
export type CompiledSchema = ((data: unknown) => boolean) & { errors?: unknown }

/** undefined when `data` passes, else the one message describing why not (root names the whole value). */
export function schemaProblem (validate: CompiledSchema, data: unknown, root: string): string | undefined {
  if (validate(data)) return undefined
  return describeIssues((validate.errors ?? []) as SchemaIssue[], root)
}
