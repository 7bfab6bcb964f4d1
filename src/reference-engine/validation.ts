/**
 * The engine re-checks every input with the gateway's schemas and wording: a service that trusts its caller turns
 * one gateway bug into bad data.
 */
import type { FastifyRequest } from 'fastify'
import { CreatePortfolioFields, UpdatePortfolioBody } from '../../schemas/portfolio.js'
import { targetPositionsProblem } from '../shared/portfolio-rules.js'
import { schemaProblem, type CompiledSchema } from '../shared/schema-validation.js'
import { validationError } from './errors.js'

/** Fastify caches the compiled schema per route, so this compiles once. */
function check<T> (request: FastifyRequest, schema: object, data: unknown, root: string): T {
  const problem = schemaProblem(request.compileValidationSchema(schema) as CompiledSchema, data, root)
  if (problem !== undefined) throw validationError(problem)
  return data as T
}

export function parseUpdateBody (request: FastifyRequest): UpdatePortfolioBody {
  const body = check<UpdatePortfolioBody>(request, UpdatePortfolioBody, request.body, 'body')
  const problem = targetPositionsProblem(body.target_positions)
  if (problem !== undefined) throw validationError(problem)
  return body
}

export function parseCreateFields (request: FastifyRequest, fields: Record<string, string>): CreatePortfolioFields {
  return check<CreatePortfolioFields>(request, CreatePortfolioFields, fields, 'form')
}
