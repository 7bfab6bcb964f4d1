/**
 * Who gets the next request (decision: several engine endpoints): Envoy's least-request with two random choices, and
 * its panic threshold. An endpoint whose last connection failed is passed over while another can be reached, so a burst
 * does not spend the retry budget on it. Called once per try, it reuses one scratch array.
 */
import type { Endpoint } from './endpoints.js'

export type Random = () => number

export class Balancer {
  readonly #scratch: Endpoint[] = []
  readonly #random: Random

  constructor (random: Random = Math.random) {
    this.#random = random
  }

  /** The endpoint for the next try, or undefined when none is left; `tried` are skipped. */
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
      // In panic, one whose last check could not connect would only add a connect failure before the 502.
      if ((e.up || (panic && !e.unreachable)) && (tried === undefined || !tried.includes(e))) {
        candidates.push(e)
        if (!e.unreachable) reachable++
      }
    }
    // In rotation but refusing: only when no reachable candidate is left.
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
