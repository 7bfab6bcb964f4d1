/**
 * Portfolio calls (spec "GET /api/portfolio/ping", "POST /api/portfolio/update").
 * Thin: the schema validates, the rules look across positions, the engine answers.
 */
import type { FastifyPluginAsync } from 'fastify'
import { LIMITS, UpdatePortfolioBody } from '../../schemas/portfolio.js'
import { isEngineUpdateResponse } from '../../schemas/upstream.js'
import type { EngineClient } from '../engine-client/client.js'
import { validationError } from '../http/errors.js'
import { sendEngineJson, sendEnginePong } from '../engine-client/answers.js'
import { targetPositionsProblem } from '../shared/portfolio-rules.js'

export interface PortfolioRouteOptions {
  engine: EngineClient
}

export const portfolioRoutes: FastifyPluginAsync<PortfolioRouteOptions> = async (app, { engine }) => {
  // No handler name: the spec gives ping simple errors only, so its failures stay { error }.
  app.get('/ping', async function pingPortfolio (request, reply) {
    const answer = await engine.call({ method: 'GET', path: '/api/portfolio/ping', requestId: request.id, userId: request.userId, traceparent: request.traceparent })
    return sendEnginePong(reply, answer)
  })

  app.post<{ Body: UpdatePortfolioBody }>('/update', {
    bodyLimit: LIMITS.updateBodyMaxBytes,
    config: { handler: 'updatePortfolio' },
    schema: { body: UpdatePortfolioBody }
  }, async function updatePortfolio (request, reply) {
    const problem = targetPositionsProblem(request.body.target_positions)
    if (problem !== undefined) throw validationError(problem)
    const answer = await engine.call({
      method: 'POST',
      path: '/api/portfolio/update',
      requestId: request.id,
      userId: request.userId,
      traceparent: request.traceparent,
      contentType: 'application/json',
      // Re-encoded from the validated value: the engine sees exactly what was checked.
      body: JSON.stringify(request.body)
    })
    return sendEngineJson(reply, answer, (v) => isEngineUpdateResponse.Check(v), '200 { success: true, message }')
  })
}
