/**
 * Replicas acknowledge idempotency records (DECISIONS 26). Replication is
 * asynchronous: a record the master stored and lost in a failover before any
 * replica had it would let a retry reach the engine again. So, where the
 * master has a replica, a stored record waits for one to acknowledge it
 * (`WAIT 1 100`) before the answer goes out; a missed acknowledgement is
 * logged and counted, and the answer still goes out.
 *
 * Whether a master has a connected replica is read from `INFO replication`
 * every few seconds, not per request: a master left alone after a failover
 * costs no wait (its records are counted as unreplicated instead, once
 * replicas have been seen, so the alert tells).
 */
import type { Cluster, Redis } from 'ioredis'
import type { RedisClient } from './client.js'
import { keySlot } from './keys.js'

export const WAIT_REPLICAS = 1
export const WAIT_TIMEOUT_MS = 100
const POLL_MS = 2_000

/** Replicas in state=online in an `INFO replication` text. */
export function onlineReplicas (info: string): number {
  return [...info.matchAll(/^slave\d+:.*\bstate=online\b/gm)].length
}

export type Acknowledgement = 'acked' | 'missed' | 'unreplicated' | 'no_replicas'

export class ReplicaWatch {
  readonly #client: RedisClient
  /** Per master ("host:port", or "" for the one master of a non-cluster client): has an online replica. */
  readonly #replicated = new Map<string, boolean>()
  /** A replica has been seen once: from then on a lone master's records count as unreplicated. */
  #everReplicated = false
  #timer: NodeJS.Timeout | undefined

  constructor (client: RedisClient) {
    this.#client = client
  }

  start (): void {
    if (this.#timer !== undefined) return
    void this.poll()
    this.#timer = setInterval(() => { void this.poll() }, POLL_MS)
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
    await Promise.all(masters.map(async ([key, node]) => {
      try {
        const replicas = onlineReplicas(await node.info('replication'))
        this.#replicated.set(key, replicas > 0)
        if (replicas > 0) this.#everReplicated = true
      } catch {}
    }))
  }

  /**
   * After `key` was written through `client` (the same client, hence the same
   * connection to its master): wait for a replica where the master has one.
   */
  async acknowledge (key: string): Promise<Acknowledgement> {
    const client = this.#client
    let node: Redis | undefined
    let master = ''
    if (isCluster(client)) {
      master = client.slots[keySlot(key)]?.[0] ?? ''
      node = client.nodes('master').find((n) => nodeKey(n) === master)
    } else {
      node = client
    }
    if (node === undefined || this.#replicated.get(master) !== true) return this.#everReplicated ? 'unreplicated' : 'no_replicas'
    try {
      return await node.wait(WAIT_REPLICAS, WAIT_TIMEOUT_MS) >= WAIT_REPLICAS ? 'acked' : 'missed'
    } catch {
      return 'missed'
    }
  }
}

export function isCluster (client: RedisClient): client is Cluster {
  return 'nodes' in client && typeof (client as Cluster).nodes === 'function' && (client as Cluster).isCluster
}

/** "host:port" of a cluster node, as ioredis names it in `slots`. */
export function nodeKey (node: Redis): string {
  return `${node.options.host ?? ''}:${String(node.options.port ?? '')}`
}
