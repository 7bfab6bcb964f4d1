/**
 * The processes of the local topology: each part is a program with its
 * arguments and environment, started with its output in the run directory's
 * logs/, its pid in pids.json, and a readiness check that asks the part
 * itself (its /health, PING, stats socket) rather than sleeping.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, writeFileSync } from 'node:fs'
import { get } from 'node:http'
import { createServer, type AddressInfo } from 'node:net'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'

export interface PartSpec {
  /** Unique in the topology: gateway-1, engine-2, redis-primary, ... */
  name: string
  command: string
  args: string[]
  env: Record<string, string>
  /** Resolves once the part serves; rejects when it cannot within the deadline. */
  ready: () => Promise<void>
}

export interface Part {
  readonly spec: PartSpec
  /** The current process (a restart replaces it). */
  proc: ChildProcess
  readonly pid: number
  /** Resolves when the current process has exited. */
  exited: Promise<void>
  log: string
}

const POLL_MS = 100

/**
 * `check` until it returns true, every 100 ms, up to `timeoutMs`; the error names what was awaited.
 * The default is generous: a Node process takes a second to start on an idle machine, but well over
 * twenty on a shared 2-core runner under load.
 */
export async function waitUntil (what: string, check: () => Promise<boolean>, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  let last: unknown
  for (;;) {
    try {
      if (await check()) return
      last = undefined
    } catch (err) {
      last = err
    }
    if (Date.now() > deadline) throw new Error(`${what}: not ready within ${timeoutMs} ms${last instanceof Error ? ` (${last.message})` : ''}`)
    await sleep(POLL_MS)
  }
}

/** GET over plain HTTP with a fresh connection; the status, or an error. */
export async function httpStatus (url: string, timeoutMs = 2_000): Promise<number> {
  return await new Promise((resolve, reject) => {
    const req = get(url, { agent: false, timeout: timeoutMs }, (res) => {
      res.resume()
      res.on('end', () => resolve(res.statusCode ?? 0))
      res.on('error', reject)
    })
    req.on('timeout', () => req.destroy(new Error(`GET ${url} timed out`)))
    req.on('error', reject)
  })
}

export async function httpText (url: string, timeoutMs = 5_000): Promise<{ status: number, body: string }> {
  return await new Promise((resolve, reject) => {
    const req = get(url, { agent: false, timeout: timeoutMs }, (res) => {
      let body = ''
      res.setEncoding('utf8').on('data', (chunk: string) => { body += chunk })
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }))
      res.on('error', reject)
    })
    req.on('timeout', () => req.destroy(new Error(`GET ${url} timed out`)))
    req.on('error', reject)
  })
}

/**
 * The kernel's ephemeral range (net.ipv4.ip_local_port_range): every listen(0) and every outgoing connection on the
 * machine takes its port from it. Where it cannot be read (not Linux), Linux's default.
 */
export function ephemeralRange (): [number, number] {
  try {
    const [low, high] = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number)
    if (Number.isInteger(low) && Number.isInteger(high)) return [low!, high!]
  } catch {}
  return [32768, 60999]
}

const POOL_LOW = 20_000

/**
 * Where freePort and its kind choose: 20000 up to the ephemeral range. A port found free inside that range could
 * be taken by any other process's listen(0) or connection before the part it was chosen for listens on it (in about
 * one run of the test suite in a hundred, by estimate); below it, only by another process choosing it at random.
 * Undefined when the range starts too low to leave room (then the kernel chooses, as listen(0) does).
 */
export function portPool (): { low: number, high: number } | undefined {
  const [ephemeralLow] = ephemeralRange()
  return ephemeralLow - POOL_LOW >= 1_000 ? { low: POOL_LOW, high: ephemeralLow - 1 } : undefined
}

/** Ports this process has handed out: never twice, so parts chosen together never share one. */
const handedOut = new Set<number>()

/**
 * A loopback port of the pool (portPool) never handed out before by this process, for which `usable` holds: chosen
 * at random, so processes choosing at once seldom meet. `pool` is for tests.
 */
export async function unusedPort (
  usable: (port: number) => Promise<boolean>,
  pool = portPool()
): Promise<number> {
  if (pool === undefined) return await kernelPort()
  for (let tries = 0; tries < 1_000; tries++) {
    const port = pool.low + Math.floor(Math.random() * (pool.high - pool.low + 1))
    if (handedOut.has(port)) continue
    // Taken before the check, which yields: a call running beside this one never checks the same port.
    handedOut.add(port)
    if (await usable(port)) return port
  }
  throw new Error(`no usable loopback port in ${pool.low}-${pool.high} after 1000 tries`)
}

/** Whether a server could listen on 127.0.0.1:`port` now (it listens, then closes). */
export async function bindable (port: number): Promise<boolean> {
  const server = createServer()
  return await new Promise((resolve) => {
    server.once('error', () => resolve(false))
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)))
  })
}

/** One the kernel chooses (listen(0)), never handed out before by this process. */
async function kernelPort (): Promise<number> {
  for (;;) {
    const server = createServer()
    server.listen(0, '127.0.0.1')
    await once(server, 'listening')
    const { port } = server.address() as AddressInfo
    server.close()
    await once(server, 'close')
    if (handedOut.has(port)) continue
    handedOut.add(port)
    return port
  }
}

/**
 * A port free on 127.0.0.1 now (a trial listen), below the ephemeral range (portPool), never handed out before by
 * this process.
 */
export async function freePort (): Promise<number> {
  return await unusedPort(bindable)
}

export function isAlive (pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM'
  }
}

/**
 * The running parts of one run directory. `detached` lets the parts outlive
 * the command that started them (npm run deploy:local returns to the shell);
 * the chaos test keeps them attached and stops them in its teardown.
 */
export class PartSet {
  readonly parts = new Map<string, Part>()
  private readonly pidFile: string
  private readonly logDir: string

  constructor (readonly runDir: string, private readonly detached: boolean) {
    this.pidFile = join(runDir, 'pids.json')
    this.logDir = join(runDir, 'logs')
    mkdirSync(this.logDir, { recursive: true })
  }

  get (name: string): Part {
    const part = this.parts.get(name)
    if (part === undefined) throw new Error(`no part named ${name}`)
    return part
  }

  /** Start a part (or start it again after it exited) and wait until it is ready. */
  async start (spec: PartSpec): Promise<Part> {
    const log = join(this.logDir, `${spec.name}.log`)
    const fd = openSync(log, 'a')
    const proc = spawn(spec.command, spec.args, {
      env: { PATH: process.env['PATH'] ?? '/usr/bin:/bin', ...spec.env },
      stdio: ['ignore', fd, fd],
      detached: this.detached
    })
    closeSync(fd)
    if (proc.pid === undefined) {
      await once(proc, 'error').then(([err]) => { throw new Error(`${spec.name}: ${spec.command} could not start (${(err as Error).message})`) })
    }
    if (this.detached) proc.unref()
    const exited = once(proc, 'exit').then(() => undefined)
    const part: Part = { spec, proc, pid: proc.pid!, exited, log }
    this.parts.set(spec.name, part)
    this.writePids()
    // A part that dies while starting (a busy port, a bad config) fails at once, pointing at its log.
    const died = exited.then(() => { throw new Error(`${spec.name} exited while starting (${String(proc.exitCode ?? proc.signalCode)}); see ${log}:\n${tail(log)}`) })
    died.catch(() => {}) // only the race below cares; a later exit is the caller's business
    await Promise.race([spec.ready(), died])
    return part
  }

  async restart (name: string): Promise<Part> {
    return await this.start(this.get(name).spec)
  }

  /** Send a signal; with `wait`, resolve once the process has exited. */
  async signal (name: string, signal: NodeJS.Signals, wait = true): Promise<void> {
    const part = this.get(name)
    if (part.proc.exitCode !== null || part.proc.signalCode !== null) return
    part.proc.kill(signal)
    if (wait) await part.exited
  }

  /**
   * SIGTERM wave after wave: each wave's parts together, the next once they
   * have exited (or been SIGKILLed after `graceMs`); parts in no wave go last.
   */
  async stopAll (waves: string[][], graceMs = 12_000): Promise<void> {
    const named = waves.flat()
    for (const wave of [...waves, [...this.parts.keys()].filter((n) => !named.includes(n))]) {
      const names = wave.filter((n) => this.parts.has(n))
      for (const name of names) await this.signal(name, 'SIGTERM', false)
      const all = Promise.all(names.map(async (n) => await this.get(n).exited))
      // The grace timer is cancelled once the wave has exited: left running, it would hold the
      // process (the chaos test's, deploy:local's) open for the whole grace after the last part.
      const grace = new AbortController()
      const timedOut = sleep(graceMs, 'timeout' as const, { signal: grace.signal }).catch(() => 'exited' as const)
      const outcome = await Promise.race([all, timedOut])
      grace.abort()
      if (outcome === 'timeout') {
        for (const name of names) await this.signal(name, 'SIGKILL', false)
        await all
      }
    }
    writeFileSync(this.pidFile, '{}\n')
  }

  private writePids (): void {
    const pids = Object.fromEntries([...this.parts].map(([name, part]) => [name, part.pid]))
    writeFileSync(this.pidFile, JSON.stringify(pids, null, 2) + '\n')
  }
}

/** The last lines of a log, for an error message. */
export function tail (path: string, lines = 15): string {
  if (!existsSync(path)) return ''
  return readFileSync(path, 'utf8').trimEnd().split('\n').slice(-lines).join('\n')
}

/**
 * `--stop` from another shell: the parts were started detached, so only
 * their pids remain. Wave after wave (as PartSet.stopAll): SIGTERM (gateways
 * and engines drain), wait, SIGKILL what is still alive after `graceMs`.
 */
export async function stopFromPidFile (runDir: string, waves: string[][], graceMs = 15_000): Promise<string[]> {
  const pidFile = join(runDir, 'pids.json')
  if (!existsSync(pidFile)) return []
  const pids = JSON.parse(readFileSync(pidFile, 'utf8')) as Record<string, number>
  const named = waves.flat()
  const stopped: string[] = []
  for (const wave of [...waves, Object.keys(pids).filter((n) => !named.includes(n))]) {
    const alive = wave.filter((n) => n in pids && isAlive(pids[n]!))
    for (const name of alive) process.kill(pids[name]!, 'SIGTERM')
    const deadline = Date.now() + graceMs
    while (alive.some((n) => isAlive(pids[n]!)) && Date.now() < deadline) await sleep(POLL_MS)
    for (const name of alive) if (isAlive(pids[name]!)) process.kill(pids[name]!, 'SIGKILL')
    stopped.push(...alive)
  }
  writeFileSync(pidFile, '{}\n')
  return stopped
}
