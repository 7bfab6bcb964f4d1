/**
 * Uploads share the engine fairly (DECISIONS 23). A create holds an engine
 * connection while its image streams, so:
 * - each subject has at most `maxPerUser` creates in progress: one more is
 *   429 `Retry-After: 1`, checked before any of its body is read, so it never
 *   opens an engine request. With a shared store (DECISIONS 23) the count
 *   is kept there, so it holds across gateways: each create holds a lease of
 *   LEASE_MS, renewed every RENEW_MS while it lasts, so the leases of a
 *   gateway that dies mid-upload expire within LEASE_MS by themselves.
 *   Renewed rather than one lease covering the longest upload (the server's
 *   180 s request timeout plus UPSTREAM_TIMEOUT_MS): that would lock a user
 *   out for minutes after a crash; renewal costs one call per user with
 *   uploads in progress every RENEW_MS. The process keeps its own count too:
 *   it refuses without a round trip, and while the store cannot be reached
 *   the cap fails open to it (one log line per change, and counted);
 * - streaming creates together hold at most `maxConnections` per engine
 *   endpoint, so ping and update always find a connection in the pool (128 per
 *   endpoint). A create past that bound waits in a bounded FIFO within
 *   UPSTREAM_TIMEOUT_MS, then 503 `Retry-After: 1`.
 */
import { randomBytes } from 'node:crypto'
import { GatewayError } from '../http/errors.js'
import type { SharedUploadCount } from './limits.js'

export interface UploadShareOptions {
  /** UPLOAD_MAX_PER_USER */
  maxPerUser: number
  /** UPLOAD_MAX_CONNECTIONS: per engine endpoint. */
  maxConnections: number
  /** How many engine endpoints there are now (the cluster client's count; 1 for a single engine). */
  endpoints: () => number
  /** The count across gateways; without it, the process's own. */
  shared?: SharedUploadCount | undefined
}

/** A shared lease lasts this long unless renewed: the bound on a dead gateway's leases. */
export const LEASE_MS = 10_000
/** Leases are renewed this often while their uploads last: three renewals can fail before one expires. */
export const RENEW_MS = 3_000
/** A place given back while the store was away is given back again this often (each try fails at once then). */
const RETURN_RETRY_MS = 200
/** At most this many places wait to be given back; past it the oldest is forgotten and its lease left to expire. */
const UNRETURNED_MAX = 10_000

interface Place { subject: string, lease: string }

interface Waiter {
  admit: () => void
  timer: NodeJS.Timeout
}

const RETRY = { 'retry-after': '1' }
/** Lease ids: this process's random prefix and a counter, unique across gateways. */
const PROCESS_ID = randomBytes(6).toString('base64url')

export class UploadShare {
  readonly #opts: UploadShareOptions
  readonly #perUser = new Map<string, number>()
  #streaming = 0
  /** FIFO of creates waiting for an upload connection; a Set keeps insertion order and deletes in O(1). */
  readonly #waiting = new Set<Waiter>()
  /** Places held with a lease (renewed), when the count is shared. */
  readonly #leased = new Set<Place>()
  /**
   * Places given back while the store could not be told (a failover, an
   * outage), by lease: their leases would count against their users until
   * they expire, so they are given back again every RETURN_RETRY_MS until a
   * ZREM (or an ENTER that carried them, #ended) is answered. Kept until then,
   * however long the outage: a call the gateway gave up on while Redis hung
   * (an ENTER, a renewal) may still sit in the receive buffer of the dropped
   * connection and run when Redis resumes, before any command of a new
   * connection, so only an answered call proves the lease gone for good.
   * Bounded by UNRETURNED_MAX.
   */
  readonly #unreturned = new Map<string, Place>()
  /**
   * Per subject, the leases of its ended uploads that the store has not been
   * seen to remove: their ZREM is on its way, or failed and waits in
   * #unreturned. The subject's next ENTER from this gateway carries them and
   * removes them first, in the same script. Without that, the order of a ZREM
   * and the next ENTER was left to the connection: in a cluster while a slot
   * moves, a redirected ZREM can reach Redis after an ENTER sent later, which
   * then found the ended upload's place still taken (429 the cap did not call for).
   */
  readonly #ended = new Map<string, Set<string>>()
  #returning: NodeJS.Timeout | undefined
  #leases = 0
  #renewal: NodeJS.Timeout | undefined
  /** The shared store answered the last time it was asked. */
  #reachable = true

  constructor (opts: UploadShareOptions) {
    this.#opts = opts
  }

  /**
   * Count a create of `subject`, or refuse it (429 TOO_MANY_UPLOADS): the
   * returned function gives the place back, once.
   */
  async enter (subject: string): Promise<() => void> {
    const max = this.#opts.maxPerUser
    const held = this.#perUser.get(subject) ?? 0
    if (held >= max) throw tooMany(max)
    // Counted before the round trip: concurrent creates of this process see it.
    this.#perUser.set(subject, held + 1)
    const shared = this.#opts.shared
    const place: Place = { subject, lease: `${PROCESS_ID}:${(++this.#leases).toString(36)}` }
    if (shared !== undefined) {
      let taken = true
      try {
        // This gateway's own ended leases of the user go in the same call, so they never refuse the user's next create.
        taken = await this.#enterShared(shared, place)
        this.#storeAnswered(shared)
      } catch (err) {
        this.#storeFailed(shared, err)
      }
      if (!taken) {
        this.#uncount(subject)
        throw tooMany(max)
      }
      // Renewed from now on, also when taken while the store was away: once back, it counts there.
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

  /** Stop renewing (the app closes): the leases left expire by themselves. */
  close (): void {
    this.#stopRenewing()
    clearInterval(this.#returning)
    this.#returning = undefined
  }

  /** Take `place` in the store, removing the subject's ended leases first; those are gone once it answers. */
  async #enterShared (shared: SharedUploadCount, place: Place): Promise<boolean> {
    const carried = [...this.#ended.get(place.subject) ?? []]
    const taken = await shared.store.enterUpload(place.subject, place.lease, this.#opts.maxPerUser, LEASE_MS, carried)
    this.#gone(place.subject, carried)
    return taken
  }

  /** The store has removed these leases of `subject`: nothing more to give back. */
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
      // The oldest is forgotten, here and in the ENTERs that would carry it: its lease expires by itself.
      const oldest = this.#unreturned.values().next().value!
      this.#unreturned.delete(oldest.lease)
      this.#gone(oldest.subject, [oldest.lease])
    }
    this.#unreturned.set(place.lease, place)
    if (this.#returning !== undefined) return
    this.#returning = setInterval(() => { this.#returnLeft(shared).catch(() => {}) }, RETURN_RETRY_MS)
    this.#returning.unref()
  }

  /** Give back every place left unreturned. */
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
   * Extend the leases held. A failed renewal is tried again next time; the
   * lease outlives three. The renewal never puts a lease back (it may run
   * late, see RENEW_UPLOADS): a lease an outage let expire, or a restart
   * lost, is taken again here, by a call made once the store has answered,
   * and only for an upload still in progress then. Taken with the cap like
   * any create: when other gateways filled the user's places meanwhile, that
   * upload is not counted there until it ends (the cap fails open).
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

  /** DECISIONS 23: the cap fails open to this process's count, as rate limits do. */
  #storeFailed (shared: SharedUploadCount, err: unknown): void {
    shared.metrics.uploadCapFailedOpen()
    if (!this.#reachable) return
    this.#reachable = false
    shared.log.warn({ reason: (err as Error).message }, "upload cap: the shared store is unreachable; counting this gateway's uploads only")
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

function tooMany (max: number): GatewayError {
  return new GatewayError('TOO_MANY_UPLOADS', `at most ${max} uploads per user at once`, { headers: RETRY })
}

function busy (): GatewayError {
  return new GatewayError('UPLOADS_BUSY', undefined, { headers: RETRY })
}
