/**
 * Which Redis the gateway shares its state through (decision: redis with more than one node): exactly one mode. Every
 * bad combination is one line that says how to fix it, never quoting a password.
 */
import { readFileSync } from 'node:fs'
import { X509Certificate } from 'node:crypto'

export interface HostPort {
  readonly host: string
  readonly port: number
}

interface RedisCommon {
  /** The PEM text, read at start. */
  readonly tlsCa?: string
}

/** Data-node credentials of the Sentinel and Cluster modes (REDIS_URL carries its own). */
interface RedisAuth {
  readonly username?: string
  readonly password?: string
}

export type RedisConfig =
  | (RedisCommon & { readonly mode: 'single'; readonly url: string }) |
  (RedisCommon &
      RedisAuth & {
        readonly mode: 'sentinel'
        readonly sentinels: readonly HostPort[]
        readonly name: string
        readonly sentinelPassword?: string
      }) |
  (RedisCommon & RedisAuth & { readonly mode: 'cluster'; readonly nodes: readonly HostPort[] })

export interface RedisEnv {
  REDIS_URL?: string | undefined
  REDIS_SENTINELS?: string | undefined
  REDIS_SENTINEL_NAME?: string | undefined
  REDIS_CLUSTER_NODES?: string | undefined
  REDIS_USERNAME?: string | undefined
  REDIS_PASSWORD?: string | undefined
  REDIS_SENTINEL_PASSWORD?: string | undefined
  REDIS_TLS_CA?: string | undefined
}

const ONE_OF =
  'set exactly one of REDIS_URL (one server), REDIS_SENTINELS with REDIS_SENTINEL_NAME (Sentinel) or ' +
    'REDIS_CLUSTER_NODES (Redis Cluster)'

/** Variables that hold secrets: never quoted in a message. */
export const REDIS_SECRET_VARIABLES: ReadonlySet<string> = new Set([
  'REDIS_URL',
  'REDIS_PASSWORD',
  'REDIS_SENTINEL_PASSWORD'
])

/** Undefined: state stays in the process. */
export function redisConfigOf (
  env: RedisEnv
): { ok: true; value: RedisConfig | undefined } | { ok: false; message: string } {
  try {
    return { ok: true, value: read(env) }
  } catch (err) {
    if (err instanceof RedisConfigProblem) return { ok: false, message: err.message }
    throw err
  }
}

class RedisConfigProblem extends Error {}

function read (env: RedisEnv): RedisConfig | undefined {
  const modes = (['REDIS_URL', 'REDIS_SENTINELS', 'REDIS_CLUSTER_NODES'] as const).filter(
    (name) => env[name] !== undefined
  )
  if (modes.length > 1) {
    throw new RedisConfigProblem(`${modes.join(' and ')} are ` +
    `${modes.length === 2 ? 'both' : 'all'} set: ${ONE_OF}`)
  }
  const mode = modes[0]
  checkCombination(env, mode)
  if (mode === undefined) return undefined
  const tls = env.REDIS_TLS_CA === undefined ? {} : { tlsCa: readCa(env.REDIS_TLS_CA) }
  const auth = {
    ...(env.REDIS_USERNAME === undefined ? {} : { username: env.REDIS_USERNAME }),
    ...(env.REDIS_PASSWORD === undefined ? {} : { password: env.REDIS_PASSWORD })
  }
  if (mode === 'REDIS_URL') return { mode: 'single', url: checkedUrl(env), ...tls }
  if (mode === 'REDIS_SENTINELS') {
    if (env.REDIS_SENTINEL_NAME === undefined) {
      throw new RedisConfigProblem(
        'REDIS_SENTINELS needs REDIS_SENTINEL_NAME: ' +
          'set it to the master group the Sentinels monitor (the <name> of "sentinel monitor <name> ...")'
      )
    }
    return {
      mode: 'sentinel',
      sentinels: hostPorts('REDIS_SENTINELS', env.REDIS_SENTINELS!),
      name: env.REDIS_SENTINEL_NAME,
      ...auth,
      ...(env.REDIS_SENTINEL_PASSWORD === undefined ? {} : { sentinelPassword: env.REDIS_SENTINEL_PASSWORD }),
      ...tls
    }
  }
  return { mode: 'cluster', nodes: hostPorts('REDIS_CLUSTER_NODES', env.REDIS_CLUSTER_NODES!), ...auth, ...tls }
}

type ModeVariable = 'REDIS_URL' | 'REDIS_SENTINELS' | 'REDIS_CLUSTER_NODES'

/** The variables that belong to another mode, or to none. */
function checkCombination (env: RedisEnv, mode: ModeVariable | undefined): void {
  if (env.REDIS_SENTINEL_NAME !== undefined && mode !== 'REDIS_SENTINELS') {
    throw new RedisConfigProblem(
      'REDIS_SENTINEL_NAME is set without REDIS_SENTINELS: ' +
        "set REDIS_SENTINELS to the Sentinels' host:port list, or unset REDIS_SENTINEL_NAME"
    )
  }
  if (env.REDIS_SENTINEL_PASSWORD !== undefined && mode !== 'REDIS_SENTINELS') {
    throw new RedisConfigProblem(
      'REDIS_SENTINEL_PASSWORD is set without REDIS_SENTINELS: ' +
        "it is the Sentinels' password; set REDIS_SENTINELS, or unset it"
    )
  }
  for (const name of ['REDIS_USERNAME', 'REDIS_PASSWORD'] as const) {
    if (env[name] === undefined) continue
    if (mode === 'REDIS_URL') {
      throw new RedisConfigProblem(
        `${name} is set with REDIS_URL: put the credentials in ` +
          `the URL (redis://user:password@host:port), or unset ${name}`
      )
    }
    if (mode === undefined) throw new RedisConfigProblem(`${name} is set but no Redis is: ${ONE_OF}, or unset ${name}`)
  }
  if (env.REDIS_USERNAME !== undefined && env.REDIS_PASSWORD === undefined) {
    throw new RedisConfigProblem(
      'REDIS_USERNAME is set without REDIS_PASSWORD: an ACL user logs in with both; set REDIS_PASSWORD too'
    )
  }
  if (env.REDIS_TLS_CA !== undefined && mode === undefined) {
    throw new RedisConfigProblem(`REDIS_TLS_CA is set but no Redis is: ${ONE_OF}, or unset REDIS_TLS_CA`)
  }
}

function checkedUrl (env: RedisEnv): string {
  const url = env.REDIS_URL!
  if (!URL.canParse(url) || new URL(url).hostname === '') {
    throw new RedisConfigProblem(
      'REDIS_URL=(hidden) is invalid: not a URL; expected redis://[user:password@]host:port[/db], or rediss:// for TLS'
    )
  }
  const port = new URL(url).port
  if (port !== '' && Number(port) === 0) {
    throw new RedisConfigProblem('REDIS_URL=(hidden) is invalid: ' +
    'port 0; use a port from 1 to 65535')
  }
  if (env.REDIS_TLS_CA !== undefined && !url.startsWith('rediss://')) {
    throw new RedisConfigProblem(
      'REDIS_TLS_CA is set but REDIS_URL is redis:// (plain): ' +
        'write rediss:// to connect with TLS, or unset REDIS_TLS_CA'
    )
  }
  return url
}

/** `host:port,host:port`, IPv6 literals in brackets; every port 1-65535. */
function hostPorts (name: string, list: string): HostPort[] {
  return list.split(',').map((entry) => {
    const at = entry.lastIndexOf(':')
    const host = entry.slice(0, at).replace(/^\[(.*)\]$/, '$1')
    const port = Number(entry.slice(at + 1))
    if (host === '' || port < 1 || port > 65535) {
      throw new RedisConfigProblem(
        `${name}=${JSON.stringify(list)} is invalid: ${JSON.stringify(entry)} is ` +
          'not host:port with a port from 1 to 65535; expected host:port,host:port'
      )
    }
    return { host, port }
  })
}

/** Read at start, so a missing file stops the start, not the first connect. */
function readCa (path: string): string {
  let pem
  try {
    pem = readFileSync(path, 'utf8')
  } catch (err) {
    throw new RedisConfigProblem(
      `REDIS_TLS_CA=${JSON.stringify(path)} cannot be read (${(err as NodeJS.ErrnoException).code ?? 'error'}): ` +
        'give the path of a PEM file with the CA certificate that signed Redis\'s certificate'
    )
  }
  try {
    new X509Certificate(pem)
  } catch {
    throw new RedisConfigProblem(
      `REDIS_TLS_CA=${JSON.stringify(path)} holds no PEM certificate: give the CA ` +
        'certificate (-----BEGIN CERTIFICATE-----) that signed Redis\'s certificate'
    )
  }
  return pem
}
