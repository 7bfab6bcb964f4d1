/**
 * Redis for the local topology, from Debian's redis-server and
 * redis-sentinel: the gateway's store (a primary, one replica, three
 * sentinels that agree by quorum 2, DECISIONS 26) and the engines' own store
 * (one node, kept apart from the gateway's).
 */
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { Redis } from 'ioredis'
import { waitUntil, type PartSpec } from './parts.js'

/** The sentinels' name for the gateway's primary (REDIS_SENTINEL_NAME). */
export const SENTINEL_NAME = 'gateway'

/** One command on a fresh connection that gives up at once rather than queueing. */
export async function redisCall (port: number, command: string, ...args: Array<string | number>): Promise<unknown> {
  const client = new Redis({
    host: '127.0.0.1',
    port,
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    enableOfflineQueue: false,
    retryStrategy: () => null,
    connectTimeout: 1_000
  })
  client.on('error', () => {}) // the awaited call below reports the failure
  try {
    await client.connect()
    return await client.call(command, ...args)
  } finally {
    client.disconnect()
  }
}

async function pong (port: number): Promise<boolean> {
  return (await redisCall(port, 'PING')) === 'PONG'
}

/** A redis-server without persistence (the chaos test kills it; nothing to keep). `replicaOf`: the primary's port. */
export function redisServerSpec (name: string, port: number, runDir: string, replicaOf?: number): PartSpec {
  const args = [
    '--port',
    String(port),
    '--bind',
    '127.0.0.1',
    '--save',
    '',
    '--appendonly',
    'no',
    '--dir',
    runDir,
    '--dbfilename',
    `${name}.rdb`,
    // Diskless, undelayed sync: a replica (or a demoted primary) catches up in milliseconds.
    '--repl-diskless-sync',
    'yes',
    '--repl-diskless-sync-delay',
    '0'
  ]
  if (replicaOf !== undefined) args.push('--replicaof', '127.0.0.1', String(replicaOf))
  return {
    name,
    command: 'redis-server',
    args,
    env: {},
    ready: async () => {
      await waitUntil(`${name} PING`, async () => await pong(port))
      if (replicaOf !== undefined) {
        await waitUntil(`${name} in sync with its primary`, async () =>
          /master_link_status:up/.test(String(await redisCall(port, 'INFO', 'replication')))
        )
      }
    }
  }
}

/** A sentinel's configuration file: it watches `group` at the primary's port, quorum 2 (Sentinel rewrites it). */
export function sentinelConf (opts: {
  port: number
  dir: string
  group: string
  primaryPort: number
  failoverTimeoutMs: number
  password?: string
}): string {
  const { port, dir, group, primaryPort, failoverTimeoutMs, password } = opts
  return [
    `port ${port}`,
    'bind 127.0.0.1',
    `dir ${dir}`,
    `sentinel monitor ${group} 127.0.0.1 ${primaryPort} 2`,
    `sentinel down-after-milliseconds ${group} 1000`,
    `sentinel failover-timeout ${group} ${failoverTimeoutMs}`,
    `sentinel parallel-syncs ${group} 1`,
    ...(password === undefined ? [] : [`sentinel auth-pass ${group} ${password}`]),
    ''
  ].join('\n')
}

/**
 * A sentinel watching the primary. down-after 1 s: a local machine's loopback
 * never stalls for a second. failover-timeout 4 s: a failover attempt that
 * fails (a vote lost on a loaded machine) is tried again after twice this,
 * 8 s, not after the 20 s a 10 s timeout gave (seen: promotion 22 s after the kill).
 */
export function sentinelSpec (name: string, port: number, primaryPort: number, runDir: string): PartSpec {
  const conf = join(runDir, `${name}.conf`)
  writeFileSync(conf, sentinelConf({ port, dir: runDir, group: SENTINEL_NAME, primaryPort, failoverTimeoutMs: 4000 }))
  return {
    name,
    command: 'redis-sentinel',
    args: [conf],
    env: {},
    ready: async () => await waitUntil(`${name} PING`, async () => await pong(port))
  }
}

/** What one sentinel says of the group: the primary's port, how many sentinels and replicas it knows. */
export async function sentinelView (
  port: number
): Promise<{ primaryPort: number; otherSentinels: number; replicas: number }> {
  const flat = (await redisCall(port, 'SENTINEL', 'MASTER', SENTINEL_NAME)) as string[]
  const info = new Map<string, string>()
  for (let i = 0; i + 1 < flat.length; i += 2) info.set(flat[i]!, flat[i + 1]!)
  return {
    primaryPort: Number(info.get('port')),
    otherSentinels: Number(info.get('num-other-sentinels')),
    replicas: Number(info.get('num-slaves'))
  }
}

/** Wait until every sentinel knows the others and a replica: only then can they fail over. */
export async function waitSentinelsFormed (ports: number[]): Promise<void> {
  await waitUntil(
    'sentinels discovering each other and the replica',
    async () => {
      const views = await Promise.all(ports.map(sentinelView))
      return views.every((v) => v.otherSentinels === ports.length - 1 && v.replicas >= 1)
    },
    30_000
  )
}

/** The primary every sentinel names, once they all name the same one (and it answers as a primary); undefined until
 * then.
 */
export async function agreedPrimary (ports: number[]): Promise<number | undefined> {
  const named = await Promise.all(
    ports.map(
      async (p) => ((await redisCall(p, 'SENTINEL', 'GET-MASTER-ADDR-BY-NAME', SENTINEL_NAME)) as [string, string])[1]
    )
  )
  if (!named.every((p) => p === named[0])) return undefined
  const port = Number(named[0])
  const role = (await redisCall(port, 'ROLE').catch(() => undefined)) as unknown[] | undefined
  return role?.[0] === 'master' ? port : undefined
}

/** How many keys match `pattern` (SCAN, never KEYS: the store may be serving). */
export async function countKeys (port: number, pattern: string): Promise<number> {
  let cursor = '0'
  let count = 0
  do {
    const [next, keys] = (await redisCall(port, 'SCAN', cursor, 'MATCH', pattern, 'COUNT', 1000)) as [string, string[]]
    cursor = next
    count += keys.length
  } while (cursor !== '0')
  return count
}
