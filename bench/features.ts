/**
 * Which optional gateway features this build has. The features land on main
 * one by one (key-set tokens, rate limits, Redis, idempotency, metrics, trace
 * context); a scenario whose feature is missing is skipped with the reason
 * rather than measured against a gateway that silently ignores its settings.
 *
 * A configuration variable is "there" when the compiled env schema names it;
 * trace context, which has no variable, when the compiled gateway mentions
 * the `traceparent` header.
 */
import { existsSync } from 'node:fs'
import { readdir, readFile } from 'node:fs/promises'
import path from 'node:path'
import { REDIS_BINARY, REDIS_CLI_BINARY } from './processes.js'

export type Feature = 'jwks' | 'rate-limit' | 'redis' | 'redis-cluster' | 'idempotency' | 'metrics' | 'shedding' | 'traceparent'

/** The agreed variable (common brief) that shows each feature is built in. */
const VARIABLE: Record<Exclude<Feature, 'traceparent'>, string> = {
  jwks: 'JWT_JWKS_URL',
  'rate-limit': 'RATE_LIMIT_PER_MINUTE',
  redis: 'REDIS_URL',
  'redis-cluster': 'REDIS_CLUSTER_NODES',
  idempotency: 'IDEMPOTENCY_TTL_S',
  metrics: 'METRICS_PORT',
  shedding: 'SHED_EVENT_LOOP_DELAY_MS'
}

/** Feature -> why it is unavailable; a feature not in the map is available. */
export type Missing = Map<Feature, string>

async function jsFiles (dir: string): Promise<string[]> {
  const entries = await readdir(dir, { withFileTypes: true }).catch(() => [])
  const nested = await Promise.all(entries.map(async (e) => {
    const full = path.join(dir, e.name)
    return e.isDirectory() ? await jsFiles(full) : e.name.endsWith('.js') ? [full] : []
  }))
  return nested.flat()
}

export async function detectFeatures (dist: string): Promise<Missing> {
  const missing: Missing = new Map()
  const envSchema = await readFile(path.join(dist, 'schemas', 'env.js'), 'utf8').catch(() => '')
  for (const [feature, variable] of Object.entries(VARIABLE) as Array<[Feature, string]>) {
    if (!envSchema.includes(variable)) missing.set(feature, `${variable} is not in this build's schemas/env.ts (feature not on this branch yet)`)
  }
  if (!missing.has('redis') && !existsSync(REDIS_BINARY)) missing.set('redis', `${REDIS_BINARY} not installed`)
  // A cluster is made by redis-cli (Debian's redis-tools).
  if (!missing.has('redis-cluster') && !existsSync(REDIS_BINARY)) missing.set('redis-cluster', `${REDIS_BINARY} not installed`)
  if (!missing.has('redis-cluster') && !existsSync(REDIS_CLI_BINARY)) missing.set('redis-cluster', `${REDIS_CLI_BINARY} not installed (redis-tools)`)
  const sources = await Promise.all((await jsFiles(path.join(dist, 'src'))).map(async (f) => await readFile(f, 'utf8')))
  if (!sources.some((text) => text.includes('traceparent'))) missing.set('traceparent', 'the gateway does not handle `traceparent` in this build (feature not on this branch yet)')
  return missing
}

/** The reason a scenario needing `features` cannot run, or undefined when it can. */
export function whyUnavailable (features: readonly Feature[], missing: Missing): string | undefined {
  const reasons = features.filter((f) => missing.has(f)).map((f) => `${f}: ${missing.get(f)!}`)
  return reasons.length === 0 ? undefined : reasons.join('; ')
}
