/**
 * Uploads share the engine fairly (decision: uploads share the engine fairly): a create holds an engine connection
 * while its image streams, so each user has a cap on creates in progress, and streaming creates hold at most
 * `maxConnections` per endpoint so ping and update always find a connection.
 */
import { randomBytes } from 'node:crypto'
import { GatewayError } from '../http/errors.js'
import type { SharedUploadCount } from './limits.js'

export interface UploadShareOptions {
  maxPerUser: number
  /** Per engine endpoint. */
  maxConnections: number
  endpoints: () => number
  /** The count across gateways; without it, the process's own. */
  shared?: SharedUploadCount | undefined
}

/**
 * Short leases, renewed, rather than one covering the longest upload, which would lock a user out for minutes after a
 * gateway crash.
 */
export const LEASE_MS = 10_000
/** Three renewals can fail before a lease expires. */
export const RENEW_MS = 3_000
const RETURN_RETRY_MS = 200
const UNRETURNED_MAX = 10_000

interface Place { subject: string, lease: string }

interface Waiter {
  admit: () => void
  timer: NodeJS.Timeout
}

const RETRY = { 'retry-after': '1' }
/** Lease ids are unique across gateways. */
const PROCESS_ID = randomBytes(6).toString('base64url')

export class UploadShare {
  readonly #opts: UploadShareOptions
  readonly #perUser = new Map<string, number>()
  #streaming = 0
  /** A FIFO: a Set keeps insertion order and deletes in O(1). */
  readonly #waiting = new Set<Waiter>()
  readonly #leased = new Set<Place>()
  /**
   * Places given back while the store could not be told, retried until a call is answered: a call abandoned while
   * Redis hung may still run when it resumes, so only an answer proves the lease gone.
   */
  readonly #unreturned = new Map<string, Place>()
  /**
   * Per subject, ended leases the store has not been seen to remove; the next ENTER removes them in the same script,
   * because a redirected ZREM can reach a cluster after an ENTER sent later.
   */
  readonly #ended = new Map<string, Set<string>>()
  #returning: NodeJS.Timeout | undefined
  #leases = 0
  #renewal: NodeJS.Timeout | undefined
  #reachable = true

  constructor (opts: UploadShareOptions) {
    this.#opts = opts
  }

  /** Counts a create of `subject` or refuses it with 429; the returned function gives the place back, once. */
  async enter (subject: string): Promise<() => void> {
    const max = this.#opts.maxPerUser
    const held = this.#perUser.get(subject) ?? 0
    if (held >= max) throw tooMany(max)
    // Counted before the round trip, so concurrent creates of this process see it.
    this.#perUser.set(subject, held + 1)
    const shared = this.#opts.shared
    const place: Place = { subject, lease: `${PROCESS_ID}:${(++this.#leases).toString(36)}` }
    if (shared !== undefined) {
      let taken = true
      try {
        taken = await this.#enterShared(shared, place)
        this.#storeAnswered(shared)
      } catch (err) {
        this.#storeFailed(shared, err)
      }
      if (!taken) {
        this.#uncount(subject)
        throw tooMany(max)
      }
      // Renewed even when taken while the store was away, so it counts there once the store is back.
      this.#leased.add(place)
      this.#renewing(shared)
    }
    let left = false
    return () => {
      if (left) return
      left = true
      this.#uncount(subject)
      if (shared !== undefined && this.#leased.delete(place)) {
        let ended = this.#ended.get(subject)
        if (ended === undefined) this.#ended.set(subject, ended = new Set())
        ended.add(place.lease)
        shared.store.leaveUpload(subject, place.lease).then(
          () => { this.#gone(subject, [place.lease]) },
          () => { if (ended.has(place.lease)) this.#leftUnreturned(shared, place) })
        if (this.#leased.size === 0) this.#stopRenewing()
      }
    }
  }

  /** The leases left expire by themselves. */
  close (): void {
    this.#stopRenewing()
    clearInterval(this.#returning)
    this.#returning = undefined
  }

  async #enterShared (shared: SharedUploadCount, place: Place): Promise<boolean> {
    const carried = [...this.#ended.get(place.subject) ?? []]
    const taken = await shared.store.enterUpload(place.subject, place.lease, this.#opts.maxPerUser, LEASE_MS, carried)
    this.#gone(place.subject, carried)
    return taken
  }

  #gone (subject: string, leases: readonly string[]): void {
    const ended = this.#ended.get(subject)
    for (const lease of leases) {
      ended?.delete(lease)
      this.#unreturned.delete(lease)
    }
    if (ended?.size === 0) this.#ended.delete(subject)
  }

  #leftUnreturned (shared: SharedUploadCount, place: Place): void {
    if (this.#unreturned.size >= UNRETURNED_MAX) {
      // The oldest is forgotten everywhere; its lease expires by itself.
      const oldest = this.#unreturned.values().next().value!
      this.#unreturned.delete(oldest.lease)
      this.#gone(oldest.subject, [oldest.lease])
    }
    this.#unreturned.set(place.lease, place)
    if (this.#returning !== undefined) return
    this.#returning = setInterval(() => { this.#returnLeft(shared).catch(() => {}) }, RETURN_RETRY_MS)
    this.#returning.unref()
  }

  async #returnLeft (shared: SharedUploadCount): Promise<void> {
    await Promise.all([...this.#unreturned.values()].map(async (place) => {
      try {
        await shared.store.leaveUpload(place.subject, place.lease)
        this.#gone(place.subject, [place.lease])
      } catch {}
    }))
    if (this.#unreturned.size === 0) {
      clearInterval(this.#returning)
      this.#returning = undefined
    }
  }

  #uncount (subject: string): void {
    const now = (this.#perUser.get(subject) ?? 1) - 1
    if (now === 0) this.#perUser.delete(subject)
    else this.#perUser.set(subject, now)
  }

  #renewing (shared: SharedUploadCount): void {
    if (this.#renewal !== undefined) return
    this.#renewal = setInterval(() => { this.#renew(shared).catch(() => {}) }, RENEW_MS)
    this.#renewal.unref()
  }

  /**
   * A lease an outage let expire is taken again only after the store has answered, and with the cap like any create,
   * since the renewal itself may run late and must never put a lease back.
   */
  async #renew (shared: SharedUploadCount): Promise<void> {
    let gone: Array<{ subject: string, lease: string }>
    try {
      gone = await shared.store.renewUploads([...this.#leased], LEASE_MS)
    } catch {
      return
    }
    const held = new Map([...this.#leased].map((place) => [place.lease, place]))
    await Promise.all(gone.map(async ({ lease }) => {
      const place = held.get(lease)
      if (place === undefined) return
      try {
        await this.#enterShared(shared, place)
      } catch {}
    }))
  }

  #stopRenewing (): void {
    clearInterval(this.#renewal)
    this.#renewal = undefined
  }

  #storeAnswered (shared: SharedUploadCount): void {
    if (this.#reachable) return
    this.#reachable = true
    shared.log.info('upload cap: counted in the shared store again')
  }

  /** The cap fails open to this process's count, as rate limits do. */
  #storeFailed (shared: SharedUploadCount, err: unknown): void {
    shared.metrics.uploadCapFailedOpen()
    if (!this.#reachable) return
    this.#reachable = false
    shared.log.warn({ reason: (err as Error).message }, 'upload cap: the shared store is unreachable; ' +
      "counting this gateway's uploads only")
  }

  /** An upload connection, in turn within `waitMs`, else 503; waiters are bounded by the connections' number. */
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
          // Counted here, not after the await, so nobody takes the place in between.
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

function tooMany (max: number): GatewayError {
  return new GatewayError('TOO_MANY_UPLOADS', `at most ${max} uploads per user at once`, { headers: RETRY })
}

function busy (): GatewayError {
  return new GatewayError('UPLOADS_BUSY', undefined, { headers: RETRY })
}
