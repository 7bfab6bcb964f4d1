/**
 * Validation messages that name the offending field (DECISIONS 7), e.g.
 * `target_positions[2].allocation must be <= 1`.
 */
import { PRINTABLE_ASCII } from '../../schemas/portfolio.js'

/** The subset of an Ajv error the messages need (Fastify passes Ajv's errors through). */
export interface SchemaIssue {
  keyword: string
  instancePath: string
  message?: string
  params: Record<string, unknown>
}

/** `/target_positions/2/allocation` -> `target_positions[2].allocation` (RFC 6901 unescaping). */
export function fieldPath (instancePath: string): string {
  let out = ''
  for (const raw of instancePath.split('/').slice(1)) {
    const segment = raw.replace(/~1/g, '/').replace(/~0/g, '~')
    out += /^\d+$/.test(segment) ? `[${segment}]` : (out === '' ? segment : `.${segment}`)
  }
  return out
}

/** Field names come from the client: cut to a length that can be shown in an answer or a log. */
export function shownName (name: string): string {
  return name.length > 64 ? `${name.slice(0, 64)}...` : name
}

function join (parent: string, child: string): string {
  return parent === '' ? shownName(child) : `${parent}.${shownName(child)}`
}

/** One readable sentence for one schema failure. `root` names the whole body. */
export function describeIssue (issue: SchemaIssue, root = 'body'): string {
  const path = fieldPath(issue.instancePath)
  const field = path === '' ? root : path
  switch (issue.keyword) {
    case 'required':
      return `${join(path, String(issue.params.missingProperty))} is required`
    case 'additionalProperties':
      return `${join(path, String(issue.params.additionalProperty))} is not an accepted field`
    case 'format':
      return issue.params.format === 'solana-address'
        ? `${field} must be a base58 Solana address (32 bytes)`
        : `${field} must be a valid ${String(issue.params.format)}`
    case 'pattern':
      return issue.params.pattern === PRINTABLE_ASCII
        ? `${field} must be visible ASCII characters (no spaces or control characters)`
        : `${field} has characters that are not allowed`
    case 'const':
      return `${field} must be ${JSON.stringify(issue.params.allowedValue)}`
    case 'anyOf':
      return `${field} has a value that is not allowed`
    default:
      return `${field} ${issue.message ?? 'is invalid'}`
  }
}

/**
 * The message for a failed validation: the first issue, except that a union
 * of literals (TypeBox's enum: anyOf of const) is described as one list.
 */
export function describeIssues (issues: readonly SchemaIssue[], root = 'body'): string {
  const first = issues[0]
  if (first === undefined) return `${root} is invalid`
  if (first.keyword === 'const') {
    const sameField = issues.filter((i) => i.instancePath === first.instancePath)
    if (sameField.some((i) => i.keyword === 'anyOf')) {
      const allowed = sameField.filter((i) => i.keyword === 'const').map((i) => String(i.params.allowedValue))
      return `${fieldPath(first.instancePath) || root} must be one of ${allowed.join(', ')}`
    }
  }
  return describeIssue(first, root)
}
