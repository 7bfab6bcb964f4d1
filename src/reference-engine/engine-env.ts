/**
 * The standalone engine's environment -> validated settings. Pure: the caller
 * passes the environment in, so tests can too (the same reader as src/config.ts, src/env.ts).
 */
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Type, type Static } from '@sinclair/typebox'
import { readEnv } from '../shared/env.js'

export const EngineEnv = Type.Object({
  ENGINE_PORT: Type.Integer({ minimum: 0, maximum: 65535, default: 4000, description: 'an integer port, 0-65535' }),
  ENGINE_HOST: Type.String({ minLength: 1, default: '127.0.0.1', description: 'a listen address such as 127.0.0.1' }),
  ENGINE_IMAGE_DIR: Type.String({ minLength: 1, description: 'a directory for uploaded images' })
})
export type EngineEnv = Static<typeof EngineEnv>

export interface EngineSettings {
  readonly port: number
  readonly host: string
  readonly imageDir: string
}

/** Its message is one line that names the variable and what it should be. */
export class EngineEnvError extends Error {
  override name = 'EngineEnvError'
}

export function defaultImageDir (): string {
  return join(tmpdir(), 'portfolio-engine-images')
}

export function loadEngineEnv (env: Record<string, string | undefined>): EngineSettings {
  // Empty counts as unset here too, so an empty ENGINE_IMAGE_DIR also gets the default.
  const read = readEnv(EngineEnv, { ...env, ENGINE_IMAGE_DIR: env['ENGINE_IMAGE_DIR'] || defaultImageDir() })
  if (!read.ok) throw new EngineEnvError(`${read.name}=${JSON.stringify(read.given)} is invalid: expected ${read.expected}`)
  const parsed = read.value
  return Object.freeze({ port: parsed.ENGINE_PORT, host: parsed.ENGINE_HOST, imageDir: parsed.ENGINE_IMAGE_DIR })
}
