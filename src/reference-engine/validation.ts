/**
 * The engine re-checks every input against the shared schemas: the gateway
 * validates first, but an internal service that trusts its caller turns one
 * gateway bug into bad data. Messages name the offending field (DECISIONS 7).
 */
import { ValueErrorType, type ValueError } from '@sinclair/typebox/errors'
import type { TSchema } from '@sinclair/typebox'
import { TypeCompiler } from '@sinclair/typebox/compiler'
// Registers the 'solana-address' format with TypeBox before the compiles below.
import { SOLANA_ADDRESS_FORMAT } from '../../schemas/formats.js'
import { CreatePortfolioFields, UpdatePortfolioBody } from '../../schemas/portfolio.js'
import { targetPositionsProblem } from '../shared/portfolio-rules.js'
import { fieldPath } from '../shared/validation-messages.js'
import { validationError } from './errors.js'

const checkUpdateBody = TypeCompiler.Compile(UpdatePortfolioBody)
const checkCreateFields = TypeCompiler.Compile(CreatePortfolioFields)

/** 'PORTFOLIO, INDEX_PORTFOLIO' for a union of literals. */
function listConsts (schema: TSchema): string {
  const options: unknown = schema['anyOf']
  return Array.isArray(options) ? (options as Array<{ const?: unknown }>).map((o) => String(o.const)).join(', ') : ''
}

/** One readable sentence for a TypeBox error, in the style "x must be <= 1". */
export function describeError (error: ValueError, root: string): string {
  const field = fieldPath(error.path) || root
  const s = error.schema
  switch (error.type) {
    case ValueErrorType.ObjectRequiredProperty: return `${field} is required`
    case ValueErrorType.ObjectAdditionalProperties: return `${field} is not an allowed field`
    case ValueErrorType.Object: return `${field} must be an object`
    case ValueErrorType.Array: return `${field} must be an array`
    case ValueErrorType.String: return `${field} must be a string`
    case ValueErrorType.Number: return `${field} must be a number`
    case ValueErrorType.StringMinLength: return `${field} must be at least ${String(s['minLength'])} characters`
    case ValueErrorType.StringMaxLength: return `${field} must be at most ${String(s['maxLength'])} characters`
    case ValueErrorType.NumberMinimum: return `${field} must be >= ${String(s['minimum'])}`
    case ValueErrorType.NumberMaximum: return `${field} must be <= ${String(s['maximum'])}`
    case ValueErrorType.ArrayMinItems: return `${field} must have at least ${String(s['minItems'])} items`
    case ValueErrorType.ArrayMaxItems: return `${field} must have at most ${String(s['maxItems'])} items`
    case ValueErrorType.Union: return `${field} must be one of ${listConsts(s)}`
    case ValueErrorType.StringFormat:
      if (s['format'] === SOLANA_ADDRESS_FORMAT) return `${field} must be a Solana address (base58 text of 32 bytes)`
      return `${field} must match format ${String(s['format'])}`
    default: return `${field}: ${error.message}`
  }
}

function firstError (error: ValueError | undefined, root: string): string {
  return error === undefined ? `${root} is invalid` : describeError(error, root)
}

export function parseUpdateBody (body: unknown): UpdatePortfolioBody {
  if (!checkUpdateBody.Check(body)) throw validationError(firstError(checkUpdateBody.Errors(body).First(), 'body'))
  // DECISIONS 3, the rules across positions: the same function the gateway applies.
  const problem = targetPositionsProblem(body.target_positions)
  if (problem !== undefined) throw validationError(problem)
  return body
}

export function parseCreateFields (fields: Record<string, string>): CreatePortfolioFields {
  if (!checkCreateFields.Check(fields)) throw validationError(firstError(checkCreateFields.Errors(fields).First(), 'form'))
  return fields
}
