/**
 * The gateway and the reference engine as real processes (dist/), for tests
 * that need several: each with only PATH and the given environment, killed in
 * teardown, its output kept for waiting and counting.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import type { Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { existsSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import type { Test } from 'tap'
import { freePort } from '../../deploy/local/parts.js'

/**
 * The repository: the nearest folder up with a package.json. Two up from
 * test/helpers, three from its compiled copy in dist/test/helpers, which is
 * what npm test runs.
 */
export const ROOT = ((): string => {
  let dir = dirname(fileURLToPath(import.meta.url))
  while (!existsSync(join(dir, 'package.json'))) {
    if (dirname(dir) === dir) throw new Error(`no package.json above ${fileURLToPath(import.meta.url)}`)
    dir = dirname(dir)
  }
  return dir
})()
export const GATEWAY_SCRIPT = join(ROOT, 'dist', 'src', 'server.js')
/** Loaded into every gateway process the helpers start: it holds each answer to openapi.json (answer-check.ts). */
export const ANSWER_CHECK = join(ROOT, 'dist', 'test', 'helpers', 'answer-check-child.js')
/** Where a gateway process writes the answers the document does not declare, one file per process id. */
export const ANSWER_VIOLATIONS_DIR = join(ROOT, 'dist', 'answer-violations')

/** Node's arguments for `script`: a gateway gets the answer check first. */
export const nodeArgs = (script: string): string[] => (script === GATEWAY_SCRIPT ? ['--import', pathToFileURL(ANSWER_CHECK).href, script] : [script])

/** Throw with what a gateway process, or a worker it forked (`<pid>-<worker>.log`), answered outside the document. */
export function assertAnswersDeclared (pid: number | undefined): void {
  if (pid === undefined || !existsSync(ANSWER_VIOLATIONS_DIR)) return
  const files = readdirSync(ANSWER_VIOLATIONS_DIR).filter((name) => name === `${pid}.log` || name.startsWith(`${pid}-`))
  let found = ''
  for (const name of files) {
    const file = join(ANSWER_VIOLATIONS_DIR, name)
    found += readFileSync(file, 'utf8')
    rmSync(file, { force: true })
  }
  if (found !== '') throw new Error(`answers the document does not declare (gateway process ${pid}):\n${found}`)
}
export const ENGINE_SCRIPT = join(ROOT, 'dist', 'src', 'reference-engine', 'standalone.js')
const WAIT_MS = 15_000

function newestSource (dir: string): number {
  let newest = 0
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name)
    if (entry.isDirectory()) newest = Math.max(newest, newestSource(path))
    else if (entry.name.endsWith('.ts')) newest = Math.max(newest, statSync(path).mtimeMs)
  }
  return newest
}

/** Compile dist/ when it is missing or older than the sources. */
export function ensureBuilt (): void {
  const built = existsSync(GATEWAY_SCRIPT) && existsSync(ENGINE_SCRIPT) ? statSync(GATEWAY_SCRIPT).mtimeMs : 0
  if (built < Math.max(newestSource(join(ROOT, 'src')), newestSource(join(ROOT, 'schemas')))) {
    execFileSync(process.execPath, [join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', join(ROOT, 'tsconfig.json')], { stdio: 'inherit', timeout: 120_000 })
  }
}

/** One free loopback port: the deployment recipe's own helper (deploy/local/parts.ts). */
export { freePort }

/**
 * A server of the test's own (a stand-in engine) listening on 127.0.0.1 at a
 * free port; closed with every connection it holds when the test ends. Its port.
 */
export async function listenOnLoopback (t: Pick<Test, 'teardown'>, server: Server): Promise<number> {
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(async () => {
    server.closeAllConnections()
    server.close()
    await once(server, 'close')
  })
  return (server.address() as AddressInfo).port
}

export interface Proc {
  proc: ChildProcess
  url: string
  out: () => string
  /** What it wrote to stderr. */
  err: () => string
  /** Resolves when stdout holds at least `count` matches of `pattern`. */
  waitFor: (pattern: RegExp, count?: number) => Promise<void>
  count: (pattern: RegExp) => number
}

/** Whether a process's start failed for a port another process holds (Node's EADDRINUSE, redis-server's words). */
const portInUse = (err: unknown): boolean => /already in use|EADDRINUSE/.test(String((err as Error).message))

/**
 * `start` on a free port, and again on another (twice at most) when another process took it between the choice and
 * the listen (test files run side by side).
 */
export async function onFreePort<T> (start: (port: number) => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await start(await freePort())
    } catch (err) {
      if (attempt >= 3 || !portInUse(err)) throw err
    }
  }
}

/**
 * `script` as a process, resolved once its stdout matches `ready`. With `env` and the `port` it listens on: that
 * port, as the caller chose it (it may have given it to others, or start on it again). With `env` a function of a
 * port instead: on a free port startProcess chooses, and started again on another (twice at most) when another
 * process took it between the choice and the listen (files run side by side); the function is called for each try
 * and may choose further ports itself (a metrics port), which a retry then chooses anew too.
 */
export async function startProcess (
  t: Test, script: string, env: Record<string, string>, port: number, ready: RegExp
): Promise<Proc>
export async function startProcess (
  t: Test,
  script: string,
  env: (port: number) => Record<string, string> | Promise<Record<string, string>>,
  ready: RegExp
): Promise<Proc & { port: number }>
export async function startProcess (
  t: Test,
  script: string,
  env: Record<string, string> | ((port: number) => Record<string, string> | Promise<Record<string, string>>),
  portOrReady: number | RegExp,
  ready?: RegExp
): Promise<Proc> {
  if (typeof env !== 'function') return await launch(t, script, env, portOrReady as number, ready!)
  return await onFreePort(async (port) =>
    Object.assign(await launch(t, script, await env(port), port, portOrReady as RegExp), { port }))
}

async function launch (
  t: Test, script: string, env: Record<string, string>, port: number, ready: RegExp
): Promise<Proc> {
  // Metrics off unless a test asks for them on a port of its own: the default 9464 may be a developer's `npm start`.
  const childEnv = { PATH: process.env['PATH'] ?? '', METRICS_PORT: '0', ...env }
  const proc = spawn(process.execPath, nodeArgs(script), { cwd: ROOT, env: childEnv, stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  let err = ''
  const waiters = new Set<() => void>()
  proc.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
    out += chunk
    for (const w of waiters) w()
  })
  proc.stderr!.setEncoding('utf8').on('data', (chunk: string) => { err += chunk })
  const exited = once(proc, 'exit')
  // Its output read to the end (or for a second, should a process it started hold the pipes): the error that
  // says why it exited is often the last thing it wrote.
  const drained = exited.then(async () => {
    await Promise.race([once(proc, 'close'), new Promise((resolve) => setTimeout(resolve, 1_000).unref())])
  })
  t.teardown(async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGKILL')
      await exited
    }
    assertAnswersDeclared(proc.pid)
  })
  const count = (pattern: RegExp): number => out.match(new RegExp(pattern.source, 'g'))?.length ?? 0
  async function waitFor (pattern: RegExp, n = 1): Promise<void> {
    if (count(pattern) >= n) return
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => { waiters.delete(check); reject(new Error(`no ${String(pattern)} x${n} within ${WAIT_MS} ms:\n${out}\n${err}`)) }, WAIT_MS)
      function check (): void {
        if (count(pattern) < n) return
        clearTimeout(timer)
        waiters.delete(check)
        resolve()
      }
      waiters.add(check)
      void drained.then(() => {
        if (!waiters.has(check)) return
        clearTimeout(timer)
        waiters.delete(check)
        reject(new Error(`process exited before ${String(pattern)}:\n${out}\n${err}`))
      })
    })
  }
  await waitFor(ready)
  return { proc, url: `http://127.0.0.1:${port}`, out: () => out, err: () => err, waitFor, count }
}
