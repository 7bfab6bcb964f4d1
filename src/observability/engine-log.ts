/**
 * What the engine cluster does, in the log: the lines an operator needs at
 * 3 a.m. to tell "an engine is ejected" from "DNS stopped answering" without
 * a dashboard. Changes only, never a line per request:
 * - an endpoint going out of rotation (warn, with why: ejected, draining,
 *   unreachable) and coming back (info);
 * - the endpoint set changing with DNS (info, the endpoints it has now);
 * - a name's lookup failing (warn, once per run of failures, with the error and
 *   the fact that its endpoints are kept), and answering again (info).
 */
import type { FastifyBaseLogger } from 'fastify'
import type { ClusterObserver } from './metrics.js'

interface ClusterSource { observeCluster: (observer: ClusterObserver) => void }

export function logEngineEvents (log: FastifyBaseLogger, engine: ClusterSource): void {
  const failing = new Map<string, string>()
  engine.observeCluster({
    rotation: (endpoint, state) => {
      if (state === 'up') log.info({ endpoint }, 'engine endpoint back in rotation')
      else log.warn({ endpoint, state }, 'engine endpoint out of rotation')
    },
    membership: (endpoints) => { log.info({ endpoints }, 'engine endpoints changed (DNS)') },
    lookup: (name, error) => {
      if (error === undefined) {
        if (failing.delete(name)) log.info({ name }, 'engine name resolves again')
        return
      }
      const reason = (error as NodeJS.ErrnoException).code ?? error.message
      if (failing.get(name) === reason) return
      failing.set(name, reason)
      log.warn({ name, reason }, 'engine name lookup failed: its endpoints are kept as they were, and it is asked again at the next refresh')
    }
  })
}
