/**
 * GATEWAY_WORKERS=N (DECISIONS 35, "Workers"): the process an operator starts
 * is worker 0 and forks N-1 copies of itself. Each is a full gateway listening
 * on PORT with SO_REUSEPORT, so the kernel spreads new connections over them
 * and no process proxies for another. Worker 0 forwards SIGTERM to the copies
 * and exits once they have all drained; a copy whose worker 0 is gone drains too.
 */
import { fork, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'

const WORKER_FLAG = '--gateway-worker='

/** This process's worker index: 0 for the process that was started, i for the copies it forked. */
export function workerIndex (argv: readonly string[] = process.argv): number {
  const flag = argv.find((arg) => arg.startsWith(WORKER_FLAG))
  return flag === undefined ? 0 : Number(flag.slice(WORKER_FLAG.length))
}

export interface Workers {
  /** The copies' process ids, by index (1 to N-1). */
  readonly pids: readonly number[]
  /** Sends SIGTERM to every copy still running; resolves once all have exited. */
  stop: () => Promise<void>
}

/**
 * Forks workers 1 to count-1 of this script, with this process's arguments,
 * flags, environment and stdout. They are detached (a process group of their
 * own) so that a terminal's Ctrl-C reaches worker 0 alone, which forwards one
 * SIGTERM: a second signal would end a draining gateway at once.
 * `onLost` is told when a copy exits while no stop was asked for.
 */
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

/**
 * In a forked copy: when worker 0 goes without stopping it (killed, crashed),
 * the IPC channel closes; `drain` then runs the copy's own graceful close.
 */
export function drainWhenOrphaned (drain: () => void): void {
  process.once('disconnect', drain)
}
