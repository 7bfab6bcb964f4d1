/**
 * The standalone engine's environment -> validated settings. Pure: the caller
 * passes the environment in, so tests can too (same approach as src/config.ts).
 */
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Type, type Static } from '@sinclair/typebox'
import { Value } from '@sinclair/typebox/value'

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
  const raw: Record<string, string> = { ENGINE_IMAGE_DIR: defaultImageDir() }
  for (const name of Object.keys(EngineEnv.properties)) {
    const value = env[name]
    // An empty variable counts as unset, as in the gateway's config.
    if (value !== undefined && value !== '') raw[name] = value
  }
  const invalid = (name: string): EngineEnvError => {
    const expected = (EngineEnv.properties as Record<string, { description?: string }>)[name]?.description ?? 'a valid value'
    return new EngineEnvError(`${name}=${JSON.stringify(raw[name])} is invalid: expected ${expected}`)
  }
  // Value.Convert turns '40.5' into 40 and '4e3' into 4000; a port must be plain digits.
  if (raw['ENGINE_PORT'] !== undefined && !/^\d+$/.test(raw['ENGINE_PORT'])) throw invalid('ENGINE_PORT')
  // Convert and Default work on a copy: they mutate, and the error message quotes the raw text.
  const candidate: unknown = Value.Default(EngineEnv, Value.Convert(EngineEnv, { ...raw }))
  const first = Value.Errors(EngineEnv, candidate).First()
  if (first !== undefined) throw invalid(first.path.replace(/^\//, ''))
  const parsed = candidate as EngineEnv
  return Object.freeze({ port: parsed.ENGINE_PORT, host: parsed.ENGINE_HOST, imageDir: parsed.ENGINE_IMAGE_DIR })
}
