/**
 * An endpoint's places (DECISIONS 33, Envoy's `max_connections` and
 * `max_pending_requests` circuit breakers kept small): a try goes to the
 * endpoint only with a place, and there are as many places as its pool has
 * connections. A try that times out destroys its socket (HTTP/1.1 cannot take
 * a request back), but the engine is most likely still working on it (or,
 * when the try was still connecting, still to accept it): its place stays
 * held, so the calls waiting behind do not turn into fresh sockets to an
 * engine that is slow because it is overloaded. Tries without a place wait
 * here, in order, never in undici's queue: one given up here (its deadline,
 * its client gone) never reaches a socket.
 *
 * Each answer from the endpoint gives one held place back, as TCP's slow start
 * grows its window: a recovered engine is back to its whole pool within a few
 * round trips, and one that answers some tries and times out others settles
 * at what it can hold. When nothing is under way and tries wait, one held
 * place is given back to the newest of them (it has the most time left) to
 * probe the engine, at most once per `probeEveryMs` (the call deadline): a slow
 * engine gets at most one new connection per period, and a recovered one is
 * found by the next probe.
 */

/** A try waiting for a place: `start` sends it. */
export interface PlaceWaiter {
  start: () => void
}

export class ConnectionCap {
  readonly size: number
  readonly probeEveryMs: number
  #inUse = 0
  #held = 0
  /** Insertion-ordered: the first waiter is the oldest. */
  readonly #waiting = new Set<PlaceWaiter>()
  /** performance.now() from which the next probe may go. */
  #nextProbeAt = 0
  #probeTimer: NodeJS.Timeout | undefined = undefined

  constructor (size: number, probeEveryMs: number) {
    this.size = size
    this.probeEveryMs = probeEveryMs
  }

  /** Tries waiting for a place (they count as queued). */
  get waiting (): number {
    return this.#waiting.size
  }

  /** Places taken by tries under way. */
  get inUse (): number {
    return this.#inUse
  }

  /** Places held by tries that timed out. */
  get held (): number {
    return this.#held
  }

  /** Take a place now (true), or wait for one: `start` runs when it is free, unless leave() comes first. */
  enter (waiter: PlaceWaiter): boolean {
    if (this.#waiting.size === 0 && this.#inUse + this.#held < this.size) {
      this.#inUse++
      return true
    }
    this.#waiting.add(waiter)
    this.#probe()
    return false
  }

  /** A waiting try is given up: it leaves the line without a place. */
  leave (waiter: PlaceWaiter): void {
    this.#waiting.delete(waiter)
  }

  /** A try with a place ended; `timedOut`: its place stays held (see the file's comment). */
  release (timedOut: boolean): void {
    this.#inUse--
    if (timedOut) this.#held++
    this.#pump()
  }

  /** The endpoint answered a try: one held place comes back. */
  answered (): void {
    if (this.#held > 0) this.#held--
  }

  /** Stop the probe timer (the endpoint is retired); the calls still waiting end by their own clocks. */
  close (): void {
    clearTimeout(this.#probeTimer)
    this.#probeTimer = undefined
  }

  #pump (): void {
    while (this.#waiting.size > 0 && this.#inUse + this.#held < this.size) {
      const next: PlaceWaiter = this.#waiting.values().next().value!
      this.#start(next)
    }
    this.#probe()
  }

  /** Nothing under way, tries waiting, every place held: the newest waiter probes, once per period. */
  #probe (): void {
    if (this.#inUse > 0 || this.#held === 0 || this.#waiting.size === 0 || this.#probeTimer !== undefined) return
    const now = performance.now()
    if (now < this.#nextProbeAt) {
      this.#probeTimer = setTimeout(() => {
        this.#probeTimer = undefined
        this.#probe()
      }, Math.max(1, this.#nextProbeAt - now))
      this.#probeTimer.unref()
      return
    }
    this.#nextProbeAt = now + this.probeEveryMs
    this.#held--
    this.#start([...this.#waiting].at(-1)!)
  }

  #start (waiter: PlaceWaiter): void {
    this.#waiting.delete(waiter)
    this.#inUse++
    waiter.start()
  }
}
