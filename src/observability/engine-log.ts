/**
 * What the engine cluster does, in the log: the lines an operator needs at
 * 3 a.m. to tell "an engine is ejected" from "DNS stopped answering" without
 * a dashboard. Changes only, never a line per request:
 * - an endpoint going out of rotation (warn, with why: ejected, draining,
 *   unreachable) and coming back (info);
 * - the endpoint set changing with DNS (info, the endpoints it has now);
 * - a name's lookup failing (warn, with the reason and the failures since the
 *   last such line; the name keeps its endpoints) and answering again (info).
 *   At most one warning a minute per name: a resolver that fails every other
 *   lookup is two lines a minute, not two per refresh. A name that fails at
 *   start is told as soon as this is installed (EngineClient replays it).
 * The reports stop when the app closes (the engine client may outlive it).
 */
import type { FastifyInstance } from 'fastify'
import type { ClusterObserver } from './metrics.js'

interface ClusterSource { observeCluster: (observer: ClusterObserver) => () => void }

/** The shortest time between two lookup warnings for one name. */
export const LOOKUP_WARNING_EVERY_MS = 60_000

interface NameState {
  /** A warning was logged since the name last answered: its answer gets a line. */
  warned: boolean
  lastWarningAt: number
  /** Failures not yet told in a line. */
  untold: number
}

export function logEngineEvents (app: FastifyInstance, engine: ClusterSource, now: () => number = Date.now): void {
  const log = app.log
  const names = new Map<string, NameState>()
  const stop = engine.observeCluster({
    rotation: (endpoint, state) => {
      if (state === 'up') log.info({ endpoint }, 'engine endpoint back in rotation')
      else log.warn({ endpoint, state }, 'engine endpoint out of rotation')
    },
    membership: (endpoints) => { log.info({ endpoints }, 'engine endpoints changed (DNS)') },
    lookup: (name, error) => {
      let s = names.get(name)
      if (s === undefined) names.set(name, s = { warned: false, lastWarningAt: -Infinity, untold: 0 })
      if (error === undefined) {
        if (s.warned) log.info({ name }, 'engine name resolves again')
        s.warned = false
        return
      }
      s.untold++
      const at = now()
      if (at - s.lastWarningAt < LOOKUP_WARNING_EVERY_MS) return
      log.warn({ name, reason: (error as NodeJS.ErrnoException).code ?? error.message, failures: s.untold }, 'engine name lookup failed: its endpoints are kept as they were, and it is asked again at the next refresh')
      s.warned = true
      s.lastWarningAt = at
      s.untold = 0
    }
  })
  app.addHook('onClose', async () => { stop() })
}
