/**
 * Schema failures in our own words, naming the field (decision: every 400 names the field), shared with the
 * reference engine so both legs answer alike; no Ajv wording reaches a client.
 */
import { PRINTABLE_ASCII } from '../../schemas/portfolio.js'
import { SOLANA_ADDRESS_FORMAT } from '../../schemas/formats.js'

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

function count (limit: unknown, noun: string): string {
  return `${String(limit)} ${noun}${limit === 1 ? '' : 's'}`
}

const ARTICLE: Readonly<Record<string, string>> = {
  array: 'an array', object: 'an object', integer: 'an integer', null: 'null'
}

/** `a number`, `a string`, `an object`; Ajv gives a list as `string,null`. */
function typeName (type: unknown): string {
  return String(type).split(',').map((t) => ARTICLE[t] ?? `a ${t}`).join(' or ')
}

export function describeIssue (issue: SchemaIssue, root = 'body'): string {
  const path = fieldPath(issue.instancePath)
  const field = path === '' ? root : path
  const p = issue.params
  switch (issue.keyword) {
    case 'required':
      return `${join(path, String(p.missingProperty))} is required`
    case 'additionalProperties':
      return `${join(path, String(p.additionalProperty))} is not an accepted field`
    case 'type':
      return `${field} must be ${typeName(p.type)}`
    // Ajv counts string lengths in code points (its `unicode` default), so "characters" is exact.
    case 'minLength':
      return `${field} must be at least ${count(p.limit, 'character')}`
    case 'maxLength':
      return `${field} must be at most ${count(p.limit, 'character')}`
    case 'minItems':
      return `${field} must have at least ${count(p.limit, 'item')}`
    case 'maxItems':
      return `${field} must have at most ${count(p.limit, 'item')}`
    case 'minimum':
    case 'maximum':
    case 'exclusiveMinimum':
    case 'exclusiveMaximum':
      return `${field} must be ${String(p.comparison)} ${String(p.limit)}`
    case 'format':
      return p.format === SOLANA_ADDRESS_FORMAT
        ? `${field} must be a base58 Solana address (32 bytes)`
        : `${field} must be a valid ${String(p.format)}`
    case 'pattern':
      return p.pattern === PRINTABLE_ASCII
        ? `${field} must be visible ASCII characters (no spaces or control characters)`
        : `${field} has characters that are not allowed`
    case 'enum':
      return `${field} must be one of ${(p.allowedValues as unknown[]).map(String).join(', ')}`
    case 'const':
      return `${field} must be ${JSON.stringify(p.allowedValue)}`
    case 'anyOf':
      return `${field} has a value that is not allowed`
    default:
      return `${field} is invalid`
  }
}

/** Ajv reports a union as each branch's failure, then `anyOf`: worded as one sentence, not the first branch's. */
export function describeIssues (issues: readonly SchemaIssue[], root = 'body'): string {
  const last = issues.at(-1)
  if (last === undefined) return `${root} is invalid`
  if (last.keyword === 'anyOf') {
    const field = fieldPath(last.instancePath) || root
    const branches = issues.slice(0, -1)
    const atField = branches.every((i) => i.instancePath === last.instancePath)
    if (atField && branches.every((i) => i.keyword === 'const')) {
      return `${field} must be one of ${branches.map((i) => String(i.params.allowedValue)).join(', ')}`
    }
    if (atField && branches.every((i) => i.keyword === 'type')) {
      return `${field} must be ${branches.map((i) => typeName(i.params.type)).join(' or ')}`
    }
    return describeIssue(last, root)
  }
  return describeIssue(issues[0]!, root)
}
