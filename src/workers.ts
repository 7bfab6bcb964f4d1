/**
 * GATEWAY_WORKERS=N: full gateways on one port with SO_REUSEPORT, so the kernel spreads connections and no
 * process proxies for another (docs/decisions/0035-a-maintained-runtime.md, "Workers").
 */
import { fork, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'

const WORKER_FLAG = '--gateway-worker='

export function workerIndex (argv: readonly string[] = process.argv): number {
  const flag = argv.find((arg) => arg.startsWith(WORKER_FLAG))
  return flag === undefined ? 0 : Number(flag.slice(WORKER_FLAG.length))
}

export interface Workers {
  readonly pids: readonly number[]
  stop: () => Promise<void>
}

/** Detached, so a terminal's Ctrl-C reaches worker 0 alone: a second signal would end a draining copy at once. */
export function forkWorkers (
  count: number,
  onLost: (index: number, code: number | null, signal: string | null) => void
): Workers {
  let stopping = false
  const children: ChildProcess[] = []
  for (let index = 1; index < count; index++) {
    const args = [...process.argv.slice(2), `${WORKER_FLAG}${index}`]
    const child = fork(process.argv[1]!, args, { detached: true, stdio: 'inherit' })
    child.once('exit', (code, signal) => { if (!stopping) onLost(index, code, signal) })
    children.push(child)
  }
  return {
    pids: children.map((c) => c.pid ?? 0),
    stop: async () => {
      stopping = true
      const running = children.filter((c) => c.exitCode === null && c.signalCode === null)
      const exited = running.map(async (c) => await once(c, 'exit'))
      for (const c of running) c.kill('SIGTERM')
      await Promise.all(exited)
    }
  }
}

/** A copy whose worker 0 died without stopping it drains on its own when the IPC channel closes. */
export function drainWhenOrphaned (drain: () => void): void {
  process.once('disconnect', drain)
}
