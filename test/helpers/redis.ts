/**
 * A real redis-server (Debian's package) for one test: on a free loopback
 * port, no persistence, ready when it says "Ready to accept connections".
 * It can be killed and restarted on the same port. Without redis-server the
 * tests skip with one line, except under CI=true, where that is a failure.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { once } from 'node:events'
import type { Test } from 'tap'
import type { Redis } from 'ioredis'
import { onFreePort } from './processes.js'
import { attemptUntil } from './until.js'

export const REDIS_MISSING =
  'redis-server not found: apt-get install redis-server (Debian/Ubuntu) to run the Redis tests'

export function redisAvailable (): boolean {
  return spawnSync('redis-server', ['--version'], { stdio: 'ignore' }).status === 0
}

/** Skip (or, under CI, fail) a test file when redis-server is missing; true when the tests can run. */
export function requireRedis (t: Test): boolean {
  if (redisAvailable()) return true
  if (process.env['CI'] === 'true') t.fail(REDIS_MISSING)
  else t.plan(0, REDIS_MISSING)
  return false
}

export interface RedisServer {
  port: number
  url: string
  /** SIGKILL, as a crash would; resolves once the process is gone. */
  kill: () => Promise<void>
  /** Start again on the same port, empty. */
  restart: () => Promise<void>
  /** SIGSTOP: the process hangs with its sockets open, as a stalled server would. */
  stop: () => void
  /** SIGCONT: it goes on where it stopped. */
  cont: () => void
}

export interface RedisStartOptions {
  /** More redis-server arguments, e.g. ['--replicaof', '127.0.0.1', '6379'] or ['--requirepass', 'pw']. */
  args?: string[]
}

export async function startRedis (t: Test, opts: RedisStartOptions = {}): Promise<RedisServer> {
  let port = 0
  // Its own directory: a replica writes the RDB it receives there (not into the working tree).
  const dir = mkdtempSync(join(tmpdir(), 'redis-test-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  let proc: ChildProcess | undefined

  async function launch (): Promise<void> {
    const child = spawn(
      'redis-server',
      [
        '--port',
        String(port),
        '--bind',
        '127.0.0.1',
        '--save',
        '',
        '--appendonly',
        'no',
        '--dir',
        dir,
        ...(opts.args ?? [])
      ],
      { stdio: ['ignore', 'pipe', 'pipe'] }
    )
    proc = child
    let out = ''
    await new Promise<void>((resolve, reject) => {
      child.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
        out += chunk
        if (out.includes('Ready to accept connections')) resolve()
      })
      // Its output read to the end first: why it exited is the last line it wrote.
      child.once('close', (code) =>
        reject(new Error(`redis-server exited (${String(code)}) before it was ready:\n${out}`))
      )
    })
  }

  async function kill (): Promise<void> {
    const child = proc
    if (child === undefined || child.exitCode !== null || child.signalCode !== null) return
    const exited = once(child, 'exit')
    child.kill('SIGKILL')
    await exited
  }

  const signal = (name: 'SIGSTOP' | 'SIGCONT') => (): void => {
    if (proc !== undefined && proc.exitCode === null && proc.signalCode === null) proc.kill(name)
  }

  // A port free when chosen can be taken by another test file's process before redis-server listens on it (files
  // run side by side): a first start refused for a port in use tries other ports, twice more. A restart keeps its port.
  await onFreePort(async (chosen) => {
    port = chosen
    await launch()
  })
  // A stopped process ignores SIGKILL's exit until continued on some systems: continue it first.
  t.teardown(async () => {
    signal('SIGCONT')()
    await kill()
  })
  return {
    port,
    url: `redis://127.0.0.1:${port}`,
    kill,
    restart: launch,
    stop: signal('SIGSTOP'),
    cont: signal('SIGCONT')
  }
}

/**
 * A primary and one replica of it (--replicaof), returned once the primary
 * lists the replica online; `probe` is a client of the primary, disconnected
 * in teardown. ioredis is loaded here, not by every user of this module.
 */
export async function startReplicated (t: Test): Promise<{ primary: RedisServer; replica: RedisServer; probe: Redis }> {
  const primary = await startRedis(t)
  const replica = await startRedis(t, { args: ['--replicaof', '127.0.0.1', String(primary.port)] })
  const { Redis: Client } = await import('ioredis')
  const probe = new Client(primary.url)
  t.teardown(() => probe.disconnect())
  await attemptUntil(
    async () => await probe.info('replication'),
    (info) => /^slave0:.*state=online/m.test(info),
    15_000
  )
  return { primary, replica, probe }
}

/** Commands Redis has run, by name (those a script runs included), read through `probe`; its own INFO left out. */
export async function commandCounts (probe: Redis): Promise<Record<string, number>> {
  return Object.fromEntries(
    [...(await probe.info('commandstats')).matchAll(/^cmdstat_(\w+):calls=(\d+)/gm)]
      .filter(([, name]) => name !== 'info')
      .map(([, name, calls]) => [name, Number(calls)])
  )
}

/**
 * Resolve once `store` answers: it connects in the background and, with no
 * offline queue, refuses commands until then. At most about 4 s.
 */
export async function untilStoreAnswers (store: {
  release: (subject: string, key: string, owner: string) => Promise<unknown>
}): Promise<void> {
  for (let i = 0; ; i++) {
    try {
      await store.release('warm', 'up', 'o')
      return
    } catch (err) {
      if (i > 200) throw err
      await new Promise((resolve) => setTimeout(resolve, 20))
    }
  }
}
