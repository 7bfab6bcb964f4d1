/**
 * An endpoint's places (DECISIONS 33, Envoy's `max_connections` and
 * `max_pending_requests` circuit breakers kept small): a try goes to the
 * endpoint only with a place, and there are as many places as its pool has
 * connections. A try that times out on a socket destroys it (HTTP/1.1 cannot
 * take a request back), but the engine is most likely still working on it (or,
 * when the try was still connecting, still to accept it): its place stays held, so the calls waiting behind do not turn into fresh sockets
 * to an engine that is slow because it is overloaded. Tries without a place
 * wait here, in order, never in undici's queue: one given up here (its
 * deadline, its client gone) never reaches a socket.
 *
 * Held places come back all at once when the endpoint answers a try (it is
 * keeping up again), and otherwise one per `holdMs`, oldest first: one try then
 * probes the engine per period, so a recovered engine is found within about
 * one period and a slow one gets at most one new connection per period.
 */

/** A try waiting for a place: `start` sends it. */
export interface PlaceWaiter {
  readonly start: () => void
}

export class ConnectionCap {
  readonly size: number
  readonly holdMs: number
  #inUse = 0
  /** When each held place was held (performance.now()), oldest first. */
  readonly #held: number[] = []
  /** Insertion-ordered: the first waiter is the oldest. */
  readonly #waiting = new Set<PlaceWaiter>()
  #timer: NodeJS.Timeout | undefined = undefined

  constructor (size: number, holdMs: number) {
    this.size = size
    this.holdMs = holdMs
  }

  /** Tries waiting for a place (they count as queued). */
  get waiting (): number {
    return this.#waiting.size
  }

  /** Places held by tries that timed out on a socket. */
  get held (): number {
    return this.#held.length
  }

  /** Take a place now (true), or wait for one: `start` runs when it is free, unless leave() comes first. */
  enter (waiter: PlaceWaiter): boolean {
    if (this.#waiting.size === 0 && this.#inUse + this.#held.length < this.size) {
      this.#inUse++
      return true
    }
    this.#waiting.add(waiter)
    return false
  }

  /** A waiting try is given up: it leaves the line without a place. */
  leave (waiter: PlaceWaiter): void {
    this.#waiting.delete(waiter)
  }

  /** A try with a place ended; `timedOut`: its place stays held (see the file's comment). */
  release (timedOut: boolean): void {
    this.#inUse--
    if (timedOut) {
      this.#held.push(performance.now())
      this.#arm()
    }
    this.#pump()
  }

  /** The endpoint answered a try: what its timed-out tries held is free. */
  answered (): void {
    if (this.#held.length === 0) return
    this.#held.length = 0
    clearTimeout(this.#timer)
    this.#timer = undefined
    this.#pump()
  }

  /** Stop the timer (the endpoint is retired); waiters left are the calls' to end. */
  close (): void {
    clearTimeout(this.#timer)
    this.#timer = undefined
  }

  #arm (): void {
    if (this.#timer !== undefined || this.#held.length === 0) return
    const due = Math.max(1, this.#held[0]! + this.holdMs - performance.now())
    this.#timer = setTimeout(() => {
      this.#timer = undefined
      this.#held.shift()
      // The next one comes back a whole period later at the soonest: one probe per period.
      if (this.#held.length > 0) this.#held[0] = Math.max(this.#held[0]!, performance.now())
      this.#arm()
      this.#pump()
    }, due)
    this.#timer.unref()
  }

  #pump (): void {
    while (this.#waiting.size > 0 && this.#inUse + this.#held.length < this.size) {
      const next: PlaceWaiter = this.#waiting.values().next().value!
      this.#waiting.delete(next)
      this.#inUse++
      next.start()
    }
  }
}
