/**
 * A stored idempotency record waits for a replica's acknowledgement, since a record lost in a failover would let a
 * retry reach the engine again (decision: redis with more than one node). WAIT blocks its connection, so it runs on a
 * client of its own, and it counts only that connection's writes, so each round first writes a key in the record's
 * slot. One round at a time per master: a slow replica meets one WAIT from this gateway, never a pile.
 */
import type { Cluster, Redis } from 'ioredis'
import type { RedisClient } from './client.js'
import { ackKey, keySlot } from './keys.js'

export const WAIT_REPLICAS = 1
export const WAIT_TIMEOUT_MS = 100
/** After a missed acknowledgement, records go out without waiting this long. */
export const PAUSE_MS = 3_000
/** Replicas are polled, not asked per request, so a master left alone after a failover costs no wait. */
const POLL_MS = 2_000
const ACK_KEY_TTL_MS = 1_000

export function onlineReplicas (info: string): number {
  return [...info.matchAll(/^slave\d+:.*\bstate=online\b/gm)].length
}

/** unreplicated: the master has no replica now but one was seen before; no_replicas: none ever was. */
export type Acknowledgement = 'acked' | 'missed' | 'paused' | 'unreplicated' | 'no_replicas'

interface Rounds {
  current?: Promise<Acknowledgement>
  /** Starts when `current` ends. */
  next?: Promise<Acknowledgement>
  pausedUntil: number
}

export class ReplicaWatch {
  readonly #client: RedisClient
  /** Per master ("host:port", or "" for a non-cluster client). */
  readonly #replicated = new Map<string, boolean>()
  readonly #rounds = new Map<string, Rounds>()
  #everReplicated = false
  #timer: NodeJS.Timeout | undefined

  /** `client` is the acknowledgements' own, never the one that stores records. */
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

  /** A master that does not answer keeps its last state. */
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

  status (): { replicated: boolean; pausedUntil: string | null } {
    const paused = Math.max(0, ...[...this.#rounds.values()].map((r) => r.pausedUntil))
    return {
      replicated: [...this.#replicated.values()].some(Boolean),
      pausedUntil: paused > Date.now() ? new Date(paused).toISOString() : null
    }
  }

  /** Called once the record's write was answered. */
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
    if (node === undefined || this.#replicated.get(master) !== true) {
      return this.#everReplicated ? 'unreplicated' : 'no_replicas'
    }
    let rounds = this.#rounds.get(master)
    if (rounds === undefined) this.#rounds.set(master, (rounds = { pausedUntil: 0 }))
    return await this.#join(rounds, node, key)
  }

  /** The next round to start, since a round already out may have missed this record's write. */
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

/** As ioredis names a node in `slots`. */
export function nodeKey (node: Redis): string {
  return `${node.options.host ?? ''}:${String(node.options.port ?? '')}`
}
