/**
 * The standalone reference engine (dist/src/reference-engine/standalone.js) as
 * a real process for one test, on a free port, with its exit awaited.
 */
import { once } from 'node:events'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Test } from 'tap'
import { ENGINE_SCRIPT, startProcess, type Proc } from './processes.js'

export interface EngineProcess extends Proc {
  port: number
  imageDir: string
  /** Resolves with [code, signal] when the process ends. */
  exited: Promise<[number | null, NodeJS.Signals | null]>
}

/** `env` adds to (or overrides) a test environment: NODE_ENV=test, loopback, a fresh image directory. */
export async function startEngineProcess (t: Test, env: Record<string, string> = {}): Promise<EngineProcess> {
  const imageDir = env['ENGINE_IMAGE_DIR'] ?? newImageDir(t)
  // On a port startProcess chooses, and another when that one is taken before the engine listens.
  const proc = await startProcess(t, ENGINE_SCRIPT, (port) => ({
    NODE_ENV: 'test', ENGINE_PORT: String(port), ENGINE_HOST: '127.0.0.1', ENGINE_IMAGE_DIR: imageDir, ...env
  }), /portfolio engine ready/)
  const exited = proc.proc.exitCode !== null || proc.proc.signalCode !== null
    ? Promise.resolve<[number | null, NodeJS.Signals | null]>([proc.proc.exitCode, proc.proc.signalCode])
    : once(proc.proc, 'exit') as Promise<[number | null, NodeJS.Signals | null]>
  return { ...proc, imageDir, exited }
}

/** A fresh image directory, removed in teardown; several engines may be given one to share. */
export function newImageDir (t: Test): string {
  const dir = mkdtempSync(join(tmpdir(), 'engine-test-images-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  return dir
}
