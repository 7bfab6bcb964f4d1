/**
 * A rollout by DNS (DECISIONS 24, 25 v2): both engines replaced as a
 * Kubernetes Deployment does it, each new one added to the name, then an old
 * one removed from it and sent SIGTERM at the same moment, under a steady load
 * of pings and updates. The name is served by an injected lookup that the test
 * changes (test/helpers/rollout.ts); the engines are the reference engine as
 * real processes on 127.0.0.2-5, one port, sharing a Redis.
 *
 * With the gateway's default DNS refresh (5 s) the set changes within the
 * rollout's 10 s only by luck: what keeps every request answered is the drain
 * (health 500), the retry of a refused connection on another endpoint, and
 * the resolution at once when an endpoint becomes unreachable or none is left
 * in rotation.
 */
import t from 'tap'
import { ensureBuilt } from '../helpers/processes.js'
import { requireRedis } from '../helpers/redis.js'
import { rollout } from '../helpers/rollout.js'

ensureBuilt()

t.test('both engines replaced through DNS under load: no client request fails', async (t) => {
  if (!requireRedis(t)) return
  const result = await rollout(t, {
    healthMs: 200,
    noticeMs: 600,
    workers: 4,
    pauseMs: 40,
    surgeMs: 300,
    afterMs: 1000
  })
  const { outcomes, failures, exits } = result
  t.same(
    exits,
    [
      [0, null],
      [0, null]
    ],
    'each old engine drained and exited 0 (SIGTERM, nothing killed in flight)'
  )
  t.ok(outcomes.length >= 100, `hundreds of requests (fewer on a loaded machine): ${outcomes.length}`)
  t.same(new Set(outcomes.map((o) => o.kind)), new Set(['ping', 'update']))
  t.same(failures, [], `0 failed of ${outcomes.length} requests`)
  t.comment(result.steps.map((s) => `${s.what} at ${(s.at - result.steps[0]!.at).toFixed(0)} ms`).join('; '))
})
