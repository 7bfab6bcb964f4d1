/**
 * Who gets the next request (DECISIONS 24): Envoy's least-request with two
 * random choices. Of two endpoints drawn at random among those in rotation,
 * the one with fewer calls in flight wins; a tie goes to the first drawn.
 * Panic: when fewer than half the endpoints are up, the health information is
 * not trusted and every endpoint takes requests (Envoy's panic threshold),
 * except those whose last health check could not connect at all: with every
 * endpoint unreachable there is no one to pick, and the answer is 502 at once.
 * Outside panic too, an endpoint whose last connection attempt failed is
 * passed over while another candidate can be reached: from its first refusal,
 * not only once 5 failures eject it, so a burst of calls does not need a retry
 * each and run out of retry budget (DECISIONS 24 counts connect-failure retries).
 *
 * Called once per try, so it allocates nothing: one scratch array is reused.
 */
import type { Endpoint } from './endpoints.js'

export type Random = () => number

export class Balancer {
  readonly #scratch: Endpoint[] = []
  readonly #random: Random

  constructor (random: Random = Math.random) {
    this.#random = random
  }

  /**
   * The endpoint for the next try, or undefined when none is left. `tried`
   * (the endpoints this call already failed on) are skipped: a retry never goes
   * to the same endpoint twice when the set has more than one.
   */
  pick (list: readonly Endpoint[], tried: readonly Endpoint[] | undefined): Endpoint | undefined {
    const n = list.length
    // A single endpoint takes every try: the client allows it only the fresh-connection retry.
    if (n === 1) return list[0]
    let up = 0
    for (let i = 0; i < n; i++) if (list[i]!.up) up++
    const panic = up * 2 < n
    const candidates = this.#scratch
    candidates.length = 0
    let reachable = 0
    for (let i = 0; i < n; i++) {
      const e = list[i]!
      // In panic every endpoint takes requests, except one whose last check could not connect:
      // trying it would only add a connect failure (or a connect timeout) before the 502.
      if ((e.up || (panic && !e.unreachable)) && (tried === undefined || !tried.includes(e))) {
        candidates.push(e)
        if (!e.unreachable) reachable++
      }
    }
    // In rotation but refusing: only when no reachable candidate is left (a refusal clears on the next connect or
    // check).
    if (reachable > 0 && reachable < candidates.length) {
      let k = 0
      for (let i = 0; i < candidates.length; i++) if (!candidates[i]!.unreachable) candidates[k++] = candidates[i]!
      candidates.length = k
    }
    const m = candidates.length
    if (m === 0) return undefined
    if (m === 1) return candidates[0]
    const a = Math.floor(this.#random() * m)
    let b = Math.floor(this.#random() * (m - 1))
    if (b >= a) b++
    const first = candidates[a]!
    const second = candidates[b]!
    candidates.length = 0
    return second.inFlight < first.inFlight ? second : first
  }
}
