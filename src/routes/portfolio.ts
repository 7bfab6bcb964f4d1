/**
 * Portfolio calls (spec "GET /api/portfolio/ping", "POST /api/portfolio/update").
 * Thin: the schema validates, the rules look across positions, the engine answers.
 */
import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify'
import fastJson from 'fast-json-stringify'
import { LIMITS, UpdatePortfolioBody } from '../../schemas/portfolio.js'
import { isEngineUpdateResponse } from '../../schemas/upstream.js'
import { callerOf, type EngineClient } from '../engine-client/client.js'
import type { EngineResponse } from '../engine-client/types.js'
import { validationError } from '../http/errors.js'
import { watchClientGone } from '../http/client-gone.js'
import { assertEngineJson, sendEngineJson, sendEnginePong } from '../engine-client/answers.js'
import { PING_ENGINE_ERRORS, UPDATE_ENGINE_ERRORS } from './openapi-answers.js'
import { targetPositionsProblem } from '../shared/portfolio-rules.js'
import { fingerprintOf, idempotencyKeyOf, type Idempotency } from '../limits/idempotency.js'

const UPDATE_ANSWER = '200 { success: true, message }'

/**
 * The validated update, written in the schema's property order whatever the
 * client's (the schema is closed: order is the only freedom left). One string
 * is both what the engine gets and the Idempotency-Key fingerprint's content.
 */
const canonicalUpdate = fastJson(UpdatePortfolioBody)

export interface PortfolioRouteOptions {
  engine: EngineClient
  idempotency: Idempotency
  /** UPSTREAM_TIMEOUT_MS: how long an update may wait for the engine. */
  engineTimeoutMs: number
}

export const portfolioRoutes: FastifyPluginAsync<PortfolioRouteOptions> = async (app, opts) => {
  // No handler name: the spec gives ping simple errors only, so its failures stay { error }.
  app.get('/ping', pingHandler(opts.engine))
  app.post<{ Body: UpdatePortfolioBody }>(
    '/update',
    {
      bodyLimit: LIMITS.updateBodyMaxBytes,
      config: { handler: 'updatePortfolio' },
      schema: { body: UpdatePortfolioBody }
    },
    updateHandler(opts)
  )
}

/**
 * A client that hangs up takes its call out of the queue for an engine connection; a call already being
 * written to the engine goes on, so an update's outcome stays known.
 */
function pingHandler (engine: EngineClient) {
  return async function pingPortfolio (request: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
    const gone = watchClientGone(reply)
    try {
      const answer = await engine.call({
        method: 'GET',
        path: '/api/portfolio/ping',
        ...callerOf(request),
        abandonIfQueued: gone.signal
      })
      return sendEnginePong(reply, answer, PING_ENGINE_ERRORS)
    } finally {
      gone.done()
    }
  }
}

type UpdateRequest = FastifyRequest<{ Body: UpdatePortfolioBody }>

function updateHandler ({ engine, idempotency, engineTimeoutMs }: PortfolioRouteOptions) {
  return async function updatePortfolio (request: UpdateRequest, reply: FastifyReply): Promise<FastifyReply> {
    const problem = targetPositionsProblem(request.body.target_positions)
    if (problem !== undefined) throw validationError(problem)
    // Written from the validated value: the engine sees exactly what was checked.
    const body = canonicalUpdate(request.body)
    const key = idempotencyKeyOf(request)
    // With an Idempotency-Key, the key is claimed before the engine is asked.
    const answer = await idempotency.run(request, reply, key, {
      fingerprint: () => fingerprintOf('update', body),
      // The body is read: what is left is the engine call, within its deadline.
      runsForMs: engineTimeoutMs,
      call: async () => await callUpdate(engine, request, reply, { key, body })
    })
    return answer === undefined ? reply : sendEngineJson(reply, answer)
  }
}

interface Update { key: string | undefined, body: string }

async function callUpdate (
  engine: EngineClient, request: FastifyRequest, reply: FastifyReply, { key, body }: Update
): Promise<EngineResponse> {
  const gone = watchClientGone(reply)
  try {
    const answer = await engine.call({
      method: 'POST',
      path: '/api/portfolio/update',
      ...callerOf(request),
      contentType: 'application/json',
      ...(key === undefined ? {} : { idempotencyKey: key }),
      body,
      abandonIfQueued: gone.signal
    })
    assertEngineJson(answer, (v) => isEngineUpdateResponse.Check(v), UPDATE_ANSWER, UPDATE_ENGINE_ERRORS)
    return answer
  } finally {
    gone.done()
  }
}
