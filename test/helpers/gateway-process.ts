/**
 * The gateway as a child process for the tests that run src/server.ts or the
 * token CLI from dist/: a clean environment, its output collected, killed in
 * teardown if it is still running.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { join } from 'node:path'
import type { Test } from 'tap'
import { Agent } from 'undici'
import { assertAnswersDeclared, GATEWAY_SCRIPT, nodeArgs, ROOT } from './processes.js'

export const SERVER = GATEWAY_SCRIPT
export const TOKEN_CLI = join(ROOT, 'dist', 'src', 'cli', 'token.js')
/** Upper bound for any one wait on a child process. */
export const WAIT_MS = 15_000

export interface Child {
  proc: ChildProcess
  /** Everything written so far. */
  out: () => string
  err: () => string
  /** Resolves when stdout holds a match for `pattern`. */
  waitForOutput: (pattern: RegExp) => Promise<RegExpMatchArray>
  exited: Promise<{ code: number | null, signal: NodeJS.Signals | null }>
}

/**
 * A child with only PATH and `env`: nothing of the test's own environment
 * (NODE_ENV, JWT_*) leaks in. Killed in teardown if it is still running.
 */
export function start (t: Test, script: string, env: Record<string, string>, args: string[] = []): Child {
  // Any free port and metrics off unless a test sets them: several gateways run at once, and a developer's
  // own `npm start` may hold the defaults (3000, 9464).
  const childEnv = { PATH: process.env['PATH'] ?? '', PORT: '0', METRICS_PORT: '0', ...env }
  const proc = spawn(process.execPath, [...nodeArgs(script), ...args], { cwd: ROOT, env: childEnv, stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  let err = ''
  proc.stdout!.setEncoding('utf8').on('data', (chunk: string) => { out += chunk })
  proc.stderr!.setEncoding('utf8').on('data', (chunk: string) => { err += chunk })
  const exited = once(proc, 'exit').then(([code, signal]) => ({ code: code as number | null, signal: signal as NodeJS.Signals | null }))
  t.teardown(async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGKILL')
      await exited
    }
    assertAnswersDeclared(proc.pid)
  })
  async function waitForOutput (pattern: RegExp): Promise<RegExpMatchArray> {
    const deadline = Date.now() + WAIT_MS
    for (;;) {
      const match = out.match(pattern)
      if (match !== null) return match
      if (proc.exitCode !== null || Date.now() > deadline) {
        throw new Error(`no ${String(pattern)} in the output (exit ${String(proc.exitCode)}):\n${out}\n${err}`)
      }
      await new Promise((resolve) => setTimeout(resolve, 20))
    }
  }
  return { proc, out: () => out, err: () => err, waitForOutput, exited }
}

export async function exitOf (child: Child): Promise<{ code: number | null, signal: NodeJS.Signals | null }> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_resolve, reject) => { timer = setTimeout(() => reject(new Error('the process did not exit in time')), WAIT_MS) })
  try {
    return await Promise.race([child.exited, timeout])
  } finally {
    clearTimeout(timer)
  }
}

/** The gateway's own "Server listening at" line (the embedded engine logs one too, under name "engine"). */
export async function gatewayUrl (child: Child): Promise<string> {
  for (;;) {
    for (const line of child.out().split('\n')) {
      if (!line.startsWith('{')) continue
      const entry = JSON.parse(line) as { msg?: string, name?: string }
      const match = entry.name === undefined ? entry.msg?.match(/^Server listening at (http:\/\/\S+)$/) : undefined
      if (match?.[1] !== undefined) return match[1]
    }
    await child.waitForOutput(/Server listening at/)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

/** A client whose sockets never outlive the test. */
export function client (t: Test): Agent {
  const agent = new Agent({ keepAliveTimeout: 10, keepAliveMaxTimeout: 10 })
  t.teardown(() => agent.close())
  return agent
}

export const lines = (text: string): string[] => text.split('\n').filter((l) => l !== '')
