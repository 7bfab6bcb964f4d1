/**
 * The engine pool belongs to the app that uses it: it closes with the app,
 * in onClose, once the requests in flight have finished. Nobody closes it by hand.
 */
import type { FastifyInstance } from 'fastify'
import type { EngineClient } from './client.js'

export function ownEngineClient (app: FastifyInstance, engine: EngineClient): void {
  app.addHook('onClose', async () => { await engine.close() })
}
