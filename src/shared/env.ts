/** Reads an environment against a TypeBox object schema, for the gateway and the standalone engine. */
import type { Static, TObject, TSchema } from '@sinclair/typebox'
import { ValueErrorType, type ValueError } from '@sinclair/typebox/errors'
import { Value } from '@sinclair/typebox/value'

export interface EnvIssue {
  readonly name: string
  readonly given: string
  readonly problem: string
  readonly expected: string
}

export type EnvResult<T> = { readonly ok: true; readonly value: T } | ({ readonly ok: false } & EnvIssue)

const WHOLE_NUMBER = /^\d+$/

/**
 * An empty variable counts as unset (`FOO= node ...` clears one). Integers must be plain digits, since
 * `Value.Convert` turns '40.5' into 40; Convert and Default mutate, so they work on a copy.
 */
export function readEnv<T extends TObject> (
  schema: T,
  env: Readonly<Record<string, string | undefined>>
): EnvResult<Static<T>> {
  const properties = schema.properties as Record<string, TSchema>
  const raw: Record<string, string> = {}
  for (const name of Object.keys(properties)) {
    const value = env[name]
    if (value !== undefined && value !== '') raw[name] = value
  }
  const issue = (name: string, problem: string): EnvResult<Static<T>> => ({
    ok: false,
    name,
    given: raw[name] ?? '',
    problem,
    expected: String(properties[name]?.description ?? 'a valid value')
  })

  for (const [name, given] of Object.entries(raw)) {
    if (properties[name]?.['type'] === 'integer' && !WHOLE_NUMBER.test(given)) {
      return issue(name, 'must be a whole number')
    }
  }
  const candidate: unknown = Value.Default(schema, Value.Convert(schema, { ...raw }))
  const first = Value.Errors(schema, candidate).First()
  if (first !== undefined) return issue(first.path.replace(/^\//, ''), problemOf(first))
  return { ok: true, value: candidate as Static<T> }
}

/** TypeBox's messages ("Expected union value") say what failed, not what to write instead. */
function problemOf (error: ValueError): string {
  const s = error.schema
  switch (error.type) {
    case ValueErrorType.IntegerMinimum:
    case ValueErrorType.IntegerMaximum:
      return `must be between ${String(s['minimum'])} and ${String(s['maximum'])}`
    case ValueErrorType.Union: {
      const options = (s['anyOf'] as Array<{ const?: unknown }>).map((o) => o.const)
      return options.every((o) => typeof o === 'string') ? `must be one of ${options.join(', ')}` : error.message
    }
    case ValueErrorType.StringMinLength:
      return `must be at least ${String(s['minLength'])} characters`
    case ValueErrorType.StringPattern:
      return 'does not have the expected form'
    default:
      return error.message
  }
}
