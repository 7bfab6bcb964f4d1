/** Liveness and connectivity (spec "GET /health", "GET /ping", "GET /api/health"). */
import type { FastifyPluginAsync, FastifyRequest } from 'fastify'
import { HealthError } from '../../schemas/errors.js'
import { ApiHealth, Liveness, Pong } from '../../schemas/health.js'
import { isEngineHealth, SERVICE_CONNECTED, type EngineHealth } from '../../schemas/upstream.js'
import { callerOf, type EngineClient } from '../engine-client/client.js'
import { parseJson } from '../engine-client/answers.js'

export interface Lifecycle {
  draining: boolean
}

export interface LivenessOptions {
  lifecycle: Lifecycle
}

export const livenessRoutes: FastifyPluginAsync<LivenessOptions> = async (app, { lifecycle }) => {
  app.get('/health', { schema: { response: { 200: Liveness, 500: HealthError } } }, async (_request, reply) => {
    // Load balancers stop routing to a 500, which is what a draining instance wants.
    if (lifecycle.draining) return reply.code(500).send({ status: 'error', message: 'shutting down' })
    return { status: 'ok', timestamp: new Date().toISOString(), uptime: process.uptime() }
  })

  app.get('/ping', { schema: { response: { 200: Pong } } }, async () => ({ message: 'pong' }))
}

export interface EngineHealthOptions {
  engine: EngineClient
  /** How long the probe may take before the engine counts as disconnected. */
  probeTimeoutMs: number
}

const DISCONNECTED = 'disconnected'

type Services = EngineHealth['services']

/**
 * Always 200, every value from probing the engine (decision: /api/health always answers 200). The probe goes where
 * calls go, so `services` come from a healthy endpoint, and the status is degraded while any is out of rotation.
 * Requests that arrive while a probe is out share it, so a burst of health requests costs the engine one request and
 * the pool one connection, however slow the engine is.
 */
export const engineHealthRoutes: FastifyPluginAsync<EngineHealthOptions> = async (app, { engine, probeTimeoutMs }) => {
  let probing: Promise<Services> | undefined
  const probe = async (request: FastifyRequest): Promise<Services> => {
    try {
      const answer = await engine.call({
        method: 'GET',
        path: '/health',
        ...callerOf(request),
        // The whole probe, body included, within the cap: one signal instead of the headers deadline.
        // The client counts its TimeoutError as a timeout, not as unavailable.
        responseTimeoutMs: 0,
        signal: AbortSignal.timeout(probeTimeoutMs)
      })
      const body = answer.status === 200 ? parseJson(answer) : undefined
      if (isEngineHealth.Check(body)) return body.services
      request.log.warn({ status: answer.status }, 'engine health answer is outside the contract')
    } catch (err) {
      request.log.warn({ err }, 'engine health probe failed')
    }
    return { database: DISCONNECTED, cache: DISCONNECTED }
  }

  app.get('/health', { schema: { response: { 200: ApiHealth } } }, async (request) => {
    // The probe's log lines and trace belong to the request that started it.
    probing ??= probe(request).finally(() => { probing = undefined })
    const { database, cache } = await probing
    const healthy = database === SERVICE_CONNECTED && cache === SERVICE_CONNECTED && !engine.degraded()
    return { status: healthy ? 'ok' : 'degraded', timestamp: new Date().toISOString(), services: { database, cache } }
  })
}
