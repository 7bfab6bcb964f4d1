/**
 * Uploads share the engine fairly (DECISIONS 23). A create holds an engine
 * connection while its image streams, so:
 * - each subject has at most `maxPerUser` creates in progress: one more is
 *   429 `Retry-After: 1`, checked before any of its body is read, so it never
 *   opens an engine request;
 * - streaming creates together hold at most `maxConnections` per engine
 *   endpoint, so ping and update always find a connection in the pool (128 per
 *   endpoint). A create past that bound waits in a bounded FIFO within
 *   UPSTREAM_TIMEOUT_MS, then 503 `Retry-After: 1`.
 */
import { GatewayError } from '../../http/errors.js'

export interface UploadShareOptions {
  /** UPLOAD_MAX_PER_USER */
  maxPerUser: number
  /** UPLOAD_MAX_CONNECTIONS: per engine endpoint. */
  maxConnections: number
  /** How many engine endpoints there are now (the cluster client's count; 1 for a single engine). */
  endpoints: () => number
}

interface Waiter {
  admit: () => void
  timer: NodeJS.Timeout
}

const RETRY = { 'retry-after': '1' }

export class UploadShare {
  readonly #opts: UploadShareOptions
  readonly #perUser = new Map<string, number>()
  #streaming = 0
  /** FIFO of creates waiting for an upload connection; a Set keeps insertion order and deletes in O(1). */
  readonly #waiting = new Set<Waiter>()

  constructor (opts: UploadShareOptions) {
    this.#opts = opts
  }

  /** Count a create of `subject`, or refuse it (429): the returned function gives the place back, once. */
  enter (subject: string): () => void {
    const held = this.#perUser.get(subject) ?? 0
    if (held >= this.#opts.maxPerUser) {
      throw new GatewayError('TOO_MANY_UPLOADS', `at most ${this.#opts.maxPerUser} uploads per user at once`, { headers: RETRY })
    }
    this.#perUser.set(subject, held + 1)
    let left = false
    return () => {
      if (left) return
      left = true
      const now = (this.#perUser.get(subject) ?? 1) - 1
      if (now === 0) this.#perUser.delete(subject)
      else this.#perUser.set(subject, now)
    }
  }

  /**
   * An upload connection: at once when fewer than the bound stream, else in
   * turn within `waitMs` (then 503). The returned function gives it back, once.
   * Waiters are bounded by the same number as the connections: past that, 503 at once.
   */
  async acquire (waitMs: number, signal?: AbortSignal): Promise<() => void> {
    const max = this.#max()
    if (this.#streaming < max && this.#waiting.size === 0) {
      this.#streaming++
      return this.#releaser()
    }
    if (this.#waiting.size >= max) throw busy()
    await new Promise<void>((resolve, reject) => {
      const waiter: Waiter = {
        admit: () => {
          // Counted here, not after the await: nobody may take the place in between.
          this.#streaming++
          this.#waiting.delete(waiter)
          clearTimeout(waiter.timer)
          signal?.removeEventListener('abort', onAbort)
          resolve()
        },
        timer: setTimeout(() => leave(busy()), waitMs)
      }
      const leave = (err: Error): void => {
        this.#waiting.delete(waiter)
        clearTimeout(waiter.timer)
        signal?.removeEventListener('abort', onAbort)
        reject(err)
      }
      const onAbort = (): void => leave(signal?.reason as Error)
      signal?.addEventListener('abort', onAbort, { once: true })
      this.#waiting.add(waiter)
    })
    return this.#releaser()
  }

  /** Creates streaming to the engine now, and creates waiting for a connection (tests, metrics). */
  get state (): { streaming: number, waiting: number } {
    return { streaming: this.#streaming, waiting: this.#waiting.size }
  }

  #max (): number {
    return this.#opts.maxConnections * Math.max(1, this.#opts.endpoints())
  }

  #releaser (): () => void {
    let given = false
    return () => {
      if (given) return
      given = true
      this.#streaming--
      this.#admitNext()
    }
  }

  #admitNext (): void {
    if (this.#streaming >= this.#max()) return
    const first = this.#waiting.values().next()
    if (first.done !== true) first.value.admit()
  }
}

function busy (): GatewayError {
  return new GatewayError('UPLOADS_BUSY', undefined, { headers: RETRY })
}
