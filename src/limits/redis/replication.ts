/**
 * Replicas acknowledge idempotency records (DECISIONS 26). Replication is
 * asynchronous: a record the master stored and lost in a failover before any
 * replica had it would let a retry reach the engine again. So, where the
 * master has a replica, a stored record waits for one to acknowledge it
 * (`WAIT 1 100`) before the answer goes out; a missed acknowledgement is
 * logged and counted, and the answer still goes out.
 *
 * WAIT blocks its connection on the server, so it runs on a connection of
 * its own (the `acks` client): claims, completions and counts never queue
 * behind it. WAIT counts the writes of its own connection, so each round
 * first writes a short-lived key in the record's slot (same master) and then
 * waits: that write comes after every record already stored, and a replica
 * that has it has them too. One round at a time per master: records stored
 * while a round is out join the next one, so a slow replica meets at most one
 * WAIT from this gateway, never a pile. Once a round is missed, records stop
 * waiting for PAUSE_MS (counted as unreplicated) and the next round asks again.
 *
 * Whether a master has a connected replica is read from `INFO replication`
 * every few seconds, not per request: a master left alone after a failover
 * costs no wait (its records are counted as unreplicated instead, once
 * replicas have been seen, so the alert tells).
 */
import type { Cluster, Redis } from 'ioredis'
import type { RedisClient } from './client.js'
import { ackKey, keySlot } from './keys.js'

export const WAIT_REPLICAS = 1
export const WAIT_TIMEOUT_MS = 100
/** After a missed acknowledgement, records go out without waiting this long. */
export const PAUSE_MS = 3_000
const POLL_MS = 2_000
/** The acknowledgement key outlives its WAIT a little, then goes. */
const ACK_KEY_TTL_MS = 1_000

/** Replicas in state=online in an `INFO replication` text. */
export function onlineReplicas (info: string): number {
  return [...info.matchAll(/^slave\d+:.*\bstate=online\b/gm)].length
}

/**
 * acked: a replica has the record; missed: WAIT timed out or failed;
 * paused: not asked, a round missed less than PAUSE_MS ago; unreplicated:
 * the master has no replica now (it had one); no_replicas: never had one.
 */
export type Acknowledgement = 'acked' | 'missed' | 'paused' | 'unreplicated' | 'no_replicas'

interface Rounds {
  /** The round whose WAIT is out. */
  current?: Promise<Acknowledgement>
  /** The round that starts when `current` ends. */
  next?: Promise<Acknowledgement>
  pausedUntil: number
}

export class ReplicaWatch {
  readonly #client: RedisClient
  /** Per master ("host:port", or "" for the one master of a non-cluster client): has an online replica. */
  readonly #replicated = new Map<string, boolean>()
  readonly #rounds = new Map<string, Rounds>()
  /** A replica has been seen once: from then on a lone master's records count as unreplicated. */
  #everReplicated = false
  #timer: NodeJS.Timeout | undefined

  /** `client`: the acknowledgements' own client, never the one that stores records. */
  constructor (client: RedisClient) {
    this.#client = client
  }

  start (): void {
    if (this.#timer !== undefined) return
    void this.poll()
    this.#timer = setInterval(() => {
      void this.poll()
    }, POLL_MS)
    this.#timer.unref()
  }

  stop (): void {
    clearInterval(this.#timer)
    this.#timer = undefined
  }

  /** Read every master's INFO replication once; a master that does not answer keeps its last state. */
  async poll (): Promise<void> {
    const masters: Array<[string, Redis]> = isCluster(this.#client)
      ? this.#client.nodes('master').map((node) => [nodeKey(node), node])
      : [['', this.#client]]
    await Promise.all(
      masters.map(async ([key, node]) => {
        try {
          const replicas = onlineReplicas(await node.info('replication'))
          this.#replicated.set(key, replicas > 0)
          if (replicas > 0) this.#everReplicated = true
        } catch {}
      })
    )
  }

  /** For GET /status: whether any master has a replica, and until when acknowledgements are paused. */
  status (): { replicated: boolean; pausedUntil: string | null } {
    const paused = Math.max(0, ...[...this.#rounds.values()].map((r) => r.pausedUntil))
    return {
      replicated: [...this.#replicated.values()].some(Boolean),
      pausedUntil: paused > Date.now() ? new Date(paused).toISOString() : null
    }
  }

  /** After a record of `subject` was stored (and its write answered): wait for a replica where the master has one. */
  async acknowledge (subject: string): Promise<Acknowledgement> {
    const client = this.#client
    const key = ackKey(subject)
    let node: Redis | undefined
    let master = ''
    if (isCluster(client)) {
      master = client.slots[keySlot(key)]?.[0] ?? ''
      node = client.nodes('master').find((n) => nodeKey(n) === master)
    } else {
      node = client
    }
    if (node === undefined || this.#replicated.get(master) !== true) { return this.#everReplicated ? 'unreplicated' : 'no_replicas' }
    let rounds = this.#rounds.get(master)
    if (rounds === undefined) this.#rounds.set(master, (rounds = { pausedUntil: 0 }))
    return await this.#join(rounds, node, key)
  }

  /** The round this record can be part of: the next one to start (a round already out may have missed its write). */
  #join (rounds: Rounds, node: Redis, key: string): Promise<Acknowledgement> {
    if (Date.now() < rounds.pausedUntil) return Promise.resolve('paused')
    if (rounds.next !== undefined) return rounds.next
    if (rounds.current === undefined) return this.#start(rounds, node, key)
    const next = rounds.current.then(() => {
      rounds.next = undefined
      return Date.now() < rounds.pausedUntil ? 'paused' : this.#start(rounds, node, key)
    })
    rounds.next = next
    return next
  }

  #start (rounds: Rounds, node: Redis, key: string): Promise<Acknowledgement> {
    const round = this.#round(rounds, node, key).finally(() => {
      if (rounds.current === round) rounds.current = undefined
    })
    rounds.current = round
    return round
  }

  async #round (rounds: Rounds, node: Redis, key: string): Promise<Acknowledgement> {
    try {
      // One connection, in this order: the write, then the WAIT that counts it.
      const [, acked] = await Promise.all([
        node.set(key, '1', 'PX', ACK_KEY_TTL_MS),
        node.wait(WAIT_REPLICAS, WAIT_TIMEOUT_MS)
      ])
      if (acked >= WAIT_REPLICAS) return 'acked'
    } catch {}
    rounds.pausedUntil = Date.now() + PAUSE_MS
    return 'missed'
  }
}

export function isCluster (client: RedisClient): client is Cluster {
  return 'nodes' in client && typeof (client as Cluster).nodes === 'function' && (client as Cluster).isCluster
}

/** "host:port" of a cluster node, as ioredis names it in `slots`. */
export function nodeKey (node: Redis): string {
  return `${node.options.host ?? ''}:${String(node.options.port ?? '')}`
}
