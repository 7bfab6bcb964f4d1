/**
 * Waits that one event fails all at once, so a body cut off mid-read wakes whatever waits on the form parser.
 * Not `Promise.race` with a long-lived promise: each race's reaction would keep its chunk reachable until the
 * upload ended (docs/performance-history.md, "Uploads").
 */
export class Interruptible {
  #reason: Error | undefined
  readonly #waiting = new Set<(reason: Error) => void>()

  interrupt (reason: Error): void {
    if (this.#reason !== undefined) return
    this.#reason = reason
    for (const fail of this.#waiting) fail(reason)
    this.#waiting.clear()
  }

  /** `pending`'s outcome, unless interrupted first. Nothing of it is kept once it settles. */
  wait<T> (pending: Promise<T>): Promise<T> {
    if (this.#reason !== undefined) {
      pending.catch(() => {})
      return Promise.reject(this.#reason)
    }
    return new Promise<T>((resolve, reject) => {
      this.#waiting.add(reject)
      pending.then((value) => {
        this.#waiting.delete(reject)
        resolve(value)
      }, (err: unknown) => {
        this.#waiting.delete(reject)
        reject(err)
      })
    })
  }
}
