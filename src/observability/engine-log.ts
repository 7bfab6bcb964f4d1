/**
 * The engine cluster's changes in the log, never a line per request, so an operator can tell "an engine is
 * ejected" from "DNS stopped answering" without a dashboard. Lookup failures warn at most once a minute per name, so
 * a flaky resolver is not a line per refresh. The reports stop when the app closes: the engine client may outlive it.
 */
import type { FastifyInstance } from 'fastify'
import type { ClusterObserver } from './metrics.js'

interface ClusterSource { observeCluster: (observer: ClusterObserver) => () => void }

/** The shortest time between two lookup warnings for one name. */
export const LOOKUP_WARNING_EVERY_MS = 60_000

interface NameState {
  warned: boolean
  lastWarningAt: number
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
      const reason = (error as NodeJS.ErrnoException).code ?? error.message
      log.warn({ name, reason, failures: s.untold }, 'engine name lookup failed: ' +
        'its endpoints are kept as they were, and it is asked again at the next refresh')
      s.warned = true
      s.lastWarningAt = at
      s.untold = 0
    }
  })
  app.addHook('onClose', async () => { stop() })
}
