/**
 * Redis as production runs it (DECISIONS 26), from Debian's packages, for one
 * test: a primary with a replica under three sentinels, a cluster of three
 * primaries, and a TLS server with a CA made in the test. Everything listens
 * on free loopback ports, persists nothing, and is killed in t.teardown.
 * Readiness is read from the servers' own log lines and INFO, never slept on.
 * Without the packages the tests skip with one line (a failure under CI=true),
 * as requireRedis does for the single server.
 */
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Redis } from 'ioredis'
import type { Test } from 'tap'
import { sentinelConf } from '../../deploy/local/redis.js'
import { freePort } from './processes.js'

const WAIT_MS = 20_000

export type Tool = 'redis-server' | 'redis-sentinel' | 'redis-cli' | 'openssl'

/** Which Debian package brings each tool. */
const PACKAGE: Record<Tool, string> = {
  'redis-server': 'redis-server',
  'redis-sentinel': 'redis-sentinel',
  'redis-cli': 'redis-tools',
  openssl: 'openssl'
}

export function missingTools (tools: readonly Tool[]): Tool[] {
  return tools.filter(
    (tool) =>
      spawnSync(tool, ['--version'], { stdio: 'ignore' }).status !== 0 &&
      // openssl answers `version`, not `--version`.
      !(tool === 'openssl' && spawnSync(tool, ['version'], { stdio: 'ignore' }).status === 0)
  )
}

/**
 * Skip (or, under CI, fail) a test file when a tool is missing; true when the
 * tests can run. The one line names the packages to install.
 */
export function requireTools (t: Test, tools: readonly Tool[], what: string): boolean {
  const missing = missingTools(tools)
  if (missing.length === 0) return true
  const line = `${missing.join(', ')} not found: apt-get install ${[...new Set(missing.map((m) => PACKAGE[m]))].join(' ')} (Debian/Ubuntu) to run the ${what} tests`
  if (process.env['CI'] === 'true') t.fail(line)
  else t.plan(0, line)
  return false
}

/** A temporary directory removed in teardown. */
function tempDir (t: Test, prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  return dir
}

export interface Daemon {
  port: number
  proc: ChildProcess
  /** Everything it has logged. */
  out: () => string
  /** Resolves when its log holds `count` matches of `pattern` (the time it was seen, ms since the epoch). */
  waitFor: (pattern: RegExp, count?: number) => Promise<number>
  /** SIGKILL, as a crash would; resolves once the process is gone. */
  kill: () => Promise<void>
}

/** Start `command args` and resolve once its log says `ready`. It logs to stdout (Redis's default). */
async function daemon (
  t: Test,
  name: string,
  command: string,
  args: string[],
  port: number,
  ready: RegExp
): Promise<Daemon> {
  const proc = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  const waiters = new Set<() => void>()
  const onData = (chunk: string): void => {
    out += chunk
    for (const w of [...waiters]) w()
  }
  proc.stdout!.setEncoding('utf8').on('data', onData)
  proc.stderr!.setEncoding('utf8').on('data', onData)
  const exited = once(proc, 'exit')
  async function kill (): Promise<void> {
    if (proc.exitCode !== null || proc.signalCode !== null) return
    proc.kill('SIGKILL')
    await exited
  }
  t.teardown(kill)
  const count = (pattern: RegExp): number => out.match(new RegExp(pattern.source, 'g'))?.length ?? 0
  async function waitFor (pattern: RegExp, n = 1): Promise<number> {
    if (count(pattern) >= n) return Date.now()
    return await new Promise<number>((resolve, reject) => {
      const fail = (why: string): void => {
        clearTimeout(timer)
        waiters.delete(check)
        reject(new Error(`${name} (port ${port}): ${why} before ${String(pattern)} x${n}:\n${out}`))
      }
      const timer = setTimeout(() => fail(`${WAIT_MS} ms passed`), WAIT_MS)
      function check (): void {
        if (proc.exitCode !== null || proc.signalCode !== null) return fail('exited')
        if (count(pattern) < n) return
        clearTimeout(timer)
        waiters.delete(check)
        resolve(Date.now())
      }
      waiters.add(check)
      proc.once('exit', check)
    })
  }
  await waitFor(ready)
  return { port, proc, out: () => out, waitFor, kill }
}

/** redis-server's common flags: loopback, nothing persisted, files in `dir`. */
const serverArgs = (port: number, dir: string): string[] => [
  '--port',
  String(port),
  '--bind',
  '127.0.0.1',
  '--save',
  '',
  '--appendonly',
  'no',
  '--dir',
  dir
]

const READY = /Ready to accept connections/

/** A client for probing a node; disconnected in teardown. */
export function probe (t: Test, port: number, opts: { ca?: string; password?: string } = {}): Redis {
  const client = new Redis({
    host: '127.0.0.1',
    port,
    maxRetriesPerRequest: 1,
    ...(opts.ca === undefined ? {} : { tls: { ca: opts.ca } }),
    ...(opts.password === undefined ? {} : { password: opts.password })
  })
  client.on('error', () => {}) // a node the test killed
  t.teardown(() => client.disconnect())
  return client
}

/** Poll `check` (a read of INFO or CLUSTER INFO, the servers' own state) until it holds. */
async function until (what: string, check: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + WAIT_MS
  while (!(await check().catch(() => false))) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${WAIT_MS} ms`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

// ---------------------------------------------------------------- Sentinel

export const MASTER_NAME = 'gateway-master'

export interface SentinelSetup {
  primary: Daemon
  replica: Daemon
  sentinels: Daemon[]
  /** REDIS_SENTINELS: the three as comma-separated host:port. */
  sentinelList: string
  /** What a sentinel says the master is now (SENTINEL get-master-addr-by-name). */
  masterAddress: (sentinel?: number) => Promise<string>
  /**
   * Resolves with the time (ms since the epoch) of the first `+switch-master`
   * any sentinel publishes, and the new master's address. Subscribed at
   * setup, so an announcement is never missed.
   */
  switched: Promise<{ at: number; address: string }>
}

/**
 * A primary, one replica and three sentinels (quorum 2), ready once each
 * sentinel has logged the replica and the two other sentinels: only then can
 * they agree on a failover. A primary not answering for 1 s is down; a
 * failover takes seconds, not minutes.
 */
export async function startSentinels (t: Test, opts: { password?: string } = {}): Promise<SentinelSetup> {
  const dir = tempDir(t, 'redis-sentinel-')
  const auth = opts.password === undefined ? [] : ['--requirepass', opts.password, '--masterauth', opts.password]
  const primaryPort = await freePort()
  const primary = await daemon(
    t,
    'primary',
    'redis-server',
    [...serverArgs(primaryPort, dir), '--dbfilename', 'primary.rdb', ...auth],
    primaryPort,
    READY
  )
  const replicaPort = await freePort()
  const replica = await daemon(
    t,
    'replica',
    'redis-server',
    [
      ...serverArgs(replicaPort, dir),
      '--dbfilename',
      'replica.rdb',
      '--replicaof',
      '127.0.0.1',
      String(primaryPort),
      ...auth
    ],
    replicaPort,
    READY
  )
  await replica.waitFor(/MASTER <-> REPLICA sync: Finished with success/)

  const ports = [await freePort(), await freePort(), await freePort()]
  const sentinels = await Promise.all(
    ports.map(async (port, i) => {
      // Sentinel rewrites its file: one each, writable.
      const file = join(dir, `sentinel-${i}.conf`)
      const conf = { port, dir, group: MASTER_NAME, primaryPort, failoverTimeoutMs: 5000, password: opts.password }
      writeFileSync(file, sentinelConf(conf))
      return await daemon(
        t,
        `sentinel ${i}`,
        'redis-sentinel',
        [file],
        port,
        new RegExp(`\\+monitor master ${MASTER_NAME} `)
      )
    })
  )
  // Each learns the replica from the primary's INFO and the others from hello messages.
  await Promise.all(
    sentinels.map(async (s) => {
      await s.waitFor(/\+slave slave 127\.0\.0\.1:/)
      await s.waitFor(/\+sentinel sentinel /, 2)
    })
  )

  const clients = sentinels.map((s) => probe(t, s.port))
  const subscribers = sentinels.map((s) => probe(t, s.port))
  const switched = new Promise<{ at: number; address: string }>((resolve) => {
    for (const sub of subscribers) {
      sub.on('message', (_channel: string, message: string) => {
        // "<name> <old-ip> <old-port> <new-ip> <new-port>"
        const [, , , ip, port] = message.split(' ')
        resolve({ at: Date.now(), address: `${String(ip)}:${String(port)}` })
      })
    }
  })
  await Promise.all(subscribers.map((sub) => sub.subscribe('+switch-master')))

  return {
    primary,
    replica,
    sentinels,
    sentinelList: ports.map((p) => `127.0.0.1:${p}`).join(','),
    masterAddress: async (i = 0) => {
      const [host, port] = (await clients[i]!.call('SENTINEL', 'get-master-addr-by-name', MASTER_NAME)) as [
        string,
        string
      ]
      return `${host}:${port}`
    },
    switched
  }
}

// ---------------------------------------------------------------- Cluster

export interface ClusterNode extends Daemon {
  id: string
  client: Redis
}

export interface ClusterSetup {
  nodes: ClusterNode[]
  /**
   * With `{ empty: true }`: a fourth primary that holds no slot, joined by
   * CLUSTER MEET, as an operator adds a node before resharding onto it. Not in
   * `nodes` nor `nodeList`; CLUSTER SLOTS does not list it until it holds a slot.
   */
  empty?: ClusterNode
  /** REDIS_CLUSTER_NODES: the three as comma-separated host:port. */
  nodeList: string
  /** The slot of a key (CLUSTER KEYSLOT), as Redis computes it. */
  slotOf: (key: string) => Promise<number>
  /** The node that serves `slot` now, from the first node's CLUSTER SHARDS view. */
  ownerOf: (slot: number) => Promise<ClusterNode>
  /**
   * Move one slot to `to` while clients keep using it, the way `redis-cli
   * --cluster reshard` does: IMPORTING on the target, MIGRATING on the source
   * (clients now get ASK for keys already moved), each key MIGRATEd on its
   * own, then SETSLOT NODE everywhere (clients now get MOVED). `between` runs
   * after the slot is marked and after each key moved, so load meets every
   * step.
   */
  moveSlot: (slot: number, to: ClusterNode, between?: () => Promise<void>) => Promise<{ keysMoved: number }>
}

/**
 * Three primaries (no replicas) made a cluster by `redis-cli --cluster
 * create`, ready once every node says cluster_state:ok and knows all three.
 * The bus port is chosen free too (cluster-port), not port + 10000, which may
 * be taken or past 65535.
 */
export async function startCluster (t: Test, opts: { empty?: boolean } = {}): Promise<ClusterSetup> {
  const dir = tempDir(t, 'redis-cluster-')
  const count = opts.empty === true ? 4 : 3
  // freePort never hands out one port twice in a process.
  const ports: number[] = []
  while (ports.length < count * 2) ports.push(await freePort())
  const [clientPorts, busList] = [ports.slice(0, count), ports.slice(count)]
  const busPorts = new Map(clientPorts.map((port, i) => [port, busList[i]!]))
  const started = await Promise.all(
    clientPorts.map(async (port, i) => {
      const bus = busPorts.get(port)!
      return await daemon(
        t,
        `cluster node ${i}`,
        'redis-server',
        [
          ...serverArgs(port, dir),
          '--dbfilename',
          `node-${i}.rdb`,
          '--cluster-enabled',
          'yes',
          '--cluster-config-file',
          join(dir, `nodes-${i}.conf`),
          '--cluster-port',
          String(bus),
          '--cluster-node-timeout',
          '5000',
          // The empty node stays a primary when a slot moved onto it is moved away again (Redis 7 would make it a
          // replica).
          ...(i === 3 ? ['--cluster-allow-replica-migration', 'no'] : [])
        ],
        port,
        READY
      )
    })
  )
  const created = spawnSync(
    'redis-cli',
    ['--cluster', 'create', ...started.slice(0, 3).map((n) => `127.0.0.1:${n.port}`), '--cluster-yes'],
    { encoding: 'utf8', timeout: WAIT_MS }
  )
  if (created.status !== 0 || !created.stdout.includes('All 16384 slots covered')) { throw new Error(`redis-cli --cluster create failed:\n${created.stdout}\n${created.stderr}`) }
  const all: ClusterNode[] = await Promise.all(
    started.map(async (n) => {
      const client = probe(t, n.port)
      return Object.assign(n, { client, id: (await client.call('CLUSTER', 'MYID')) as string })
    })
  )
  const nodes = all.slice(0, 3)
  const empty = all[3]
  // The empty node meets the first on its bus port (the free one chosen above, not port + 10000).
  if (empty !== undefined) { await empty.client.call('CLUSTER', 'MEET', '127.0.0.1', nodes[0]!.port, busPorts.get(nodes[0]!.port)!) }
  await Promise.all(
    all.map((n) =>
      until(`cluster node ${n.port} ok`, async () => {
        const info = (await n.client.call('CLUSTER', 'INFO')) as string
        return (
          info.includes('cluster_state:ok') &&
          info.includes(`cluster_known_nodes:${all.length}`) &&
          info.includes('cluster_slots_assigned:16384')
        )
      })
    )
  )

  const slotOf = async (key: string): Promise<number> =>
    (await nodes[0]!.client.call('CLUSTER', 'KEYSLOT', key)) as number
  async function ownerOf (slot: number): Promise<ClusterNode> {
    // CLUSTER SLOTS: [[start, end, [ip, port, id], ...], ...]
    const ranges = (await nodes[0]!.client.call('CLUSTER', 'SLOTS')) as Array<
      [number, number, [string, number, string]]
    >
    const range = ranges.find(([start, end]) => start <= slot && slot <= end)
    const owner = all.find((n) => n.id === range?.[2][2])
    if (owner === undefined) throw new Error(`slot ${slot} has no owner`)
    return owner
  }
  async function moveSlot (
    slot: number,
    to: ClusterNode,
    between: () => Promise<void> = async () => {}
  ): Promise<{ keysMoved: number }> {
    const from = await ownerOf(slot)
    if (from === to) throw new Error(`slot ${slot} is already on ${to.port}`)
    await to.client.call('CLUSTER', 'SETSLOT', slot, 'IMPORTING', from.id)
    await from.client.call('CLUSTER', 'SETSLOT', slot, 'MIGRATING', to.id)
    await between()
    let keysMoved = 0
    for (;;) {
      const keys = (await from.client.call('CLUSTER', 'GETKEYSINSLOT', slot, 1)) as string[]
      if (keys.length === 0) break
      await from.client.call('MIGRATE', '127.0.0.1', to.port, '', 0, 5000, 'KEYS', ...keys)
      keysMoved += keys.length
      await between()
    }
    // The target first, so it never refuses the slot's keys; then the others (redis-cli's order).
    for (const node of [to, from, ...all.filter((n) => n !== to && n !== from)]) { await node.client.call('CLUSTER', 'SETSLOT', slot, 'NODE', to.id) }
    return { keysMoved }
  }
  return {
    nodes,
    ...(empty === undefined ? {} : { empty }),
    nodeList: nodes.map((n) => `127.0.0.1:${n.port}`).join(','),
    slotOf,
    ownerOf,
    moveSlot
  }
}

// ---------------------------------------------------------------- TLS

export interface TlsFiles {
  dir: string
  /** PEM of the CA that signed the server's certificate (for REDIS_TLS_CA). */
  caFile: string
  ca: string
  certFile: string
  keyFile: string
}

/** A CA and a server certificate for 127.0.0.1 and localhost, made with openssl (EC P-256: fast). */
export function makeCertificates (t: Test): TlsFiles {
  const dir = tempDir(t, 'redis-tls-')
  const run = (...args: string[]): void => {
    execFileSync('openssl', args, { cwd: dir, stdio: 'pipe', timeout: WAIT_MS })
  }
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes']
  run(
    'req',
    '-x509',
    ...ec,
    '-keyout',
    'ca.key',
    '-out',
    'ca.crt',
    '-days',
    '2',
    '-subj',
    '/CN=gateway test CA',
    '-addext',
    'basicConstraints=critical,CA:TRUE',
    '-addext',
    'keyUsage=critical,keyCertSign,cRLSign'
  )
  run('req', ...ec, '-keyout', 'server.key', '-out', 'server.csr', '-subj', '/CN=localhost')
  writeFileSync(join(dir, 'server.ext'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n')
  run(
    'x509',
    '-req',
    '-in',
    'server.csr',
    '-CA',
    'ca.crt',
    '-CAkey',
    'ca.key',
    '-CAcreateserial',
    '-out',
    'server.crt',
    '-days',
    '2',
    '-extfile',
    'server.ext'
  )
  const caFile = join(dir, 'ca.crt')
  return {
    dir,
    caFile,
    ca: readFileSync(caFile, 'utf8'),
    certFile: join(dir, 'server.crt'),
    keyFile: join(dir, 'server.key')
  }
}

export interface TlsRedis extends Daemon {
  files: TlsFiles
  /** rediss://127.0.0.1:port, with the password when one was given. */
  url: string
}

/** redis-server speaking only TLS (--port 0), clients not asked for certificates. */
export async function startTlsRedis (t: Test, opts: { password?: string } = {}): Promise<TlsRedis> {
  const files = makeCertificates(t)
  const port = await freePort()
  const server = await daemon(
    t,
    'tls redis',
    'redis-server',
    [
      ...serverArgs(0, files.dir),
      '--tls-port',
      String(port),
      '--tls-cert-file',
      files.certFile,
      '--tls-key-file',
      files.keyFile,
      '--tls-ca-cert-file',
      files.caFile,
      '--tls-auth-clients',
      'no',
      ...(opts.password === undefined ? [] : ['--requirepass', opts.password])
    ],
    port,
    READY
  )
  const auth = opts.password === undefined ? '' : `:${encodeURIComponent(opts.password)}@`
  return Object.assign(server, { files, url: `rediss://${auth}127.0.0.1:${port}` })
}
