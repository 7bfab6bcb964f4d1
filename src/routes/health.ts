/** Liveness and connectivity (spec "GET /health", "GET /ping", "GET /api/health"). */
import type { FastifyPluginAsync } from 'fastify'
import { HealthError } from '../../schemas/errors.js'
import { ApiHealth, Liveness, Pong } from '../../schemas/health.js'
import { isEngineHealth, SERVICE_CONNECTED } from '../../schemas/upstream.js'
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

/**
 * Always 200, every value from probing the engine (decision: /api/health always answers 200). The probe goes where
 * calls go, so `services` come from a healthy endpoint, and the status is degraded while any is out of rotation.
 */
export const engineHealthRoutes: FastifyPluginAsync<EngineHealthOptions> = async (app, { engine, probeTimeoutMs }) => {
  app.get('/health', { schema: { response: { 200: ApiHealth } } }, async (request) => {
    let database = DISCONNECTED
    let cache = DISCONNECTED
    try {
      const answer = await engine.call({
        method: 'GET',
        path: '/health',
        ...callerOf(request),
        // The whole probe, body included, within the cap: the signal. The headers deadline too, so that a probe
        // timed out on its socket keeps it, as a ping does: health requests open no new connections to a slow engine.
        // The client counts the signal's TimeoutError as a timeout, not as unavailable.
        responseTimeoutMs: probeTimeoutMs,
        signal: AbortSignal.timeout(probeTimeoutMs)
      })
      const body = answer.status === 200 ? parseJson(answer) : undefined
      if (isEngineHealth.Check(body)) ({ database, cache } = body.services)
      else request.log.warn({ status: answer.status }, 'engine health answer is outside the contract')
    } catch (err) {
      request.log.warn({ err }, 'engine health probe failed')
    }
    const healthy = database === SERVICE_CONNECTED && cache === SERVICE_CONNECTED && !engine.degraded()
    return { status: healthy ? 'ok' : 'degraded', timestamp: new Date().toISOString(), services: { database, cache } }
  })
}
