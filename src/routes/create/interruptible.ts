/**
 * Waits that one event fails all at once: the body cut off mid-read
 * (CreateUpload.cutOff) wakes whatever waits on the form parser.
 *
 * Not `Promise.race([wait, longLived])`: each race leaves a reaction on the
 * long-lived promise, and that reaction holds the race's result until the
 * long-lived promise settles. Every 64 KiB chunk of an image stayed reachable
 * until its upload ended: 16 concurrent 9 MiB uploads grew the gateway's RSS
 * by 135 MB (docs/performance-history.md, "Uploads").
 */
export class Interruptible {
  #reason: Error | undefined
  readonly #waiting = new Set<(reason: Error) => void>()

  /** Fail every wait in progress and every later one with `reason`; the first reason stays. */
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
