/**
 * haproxy for the local topology: deploy/haproxy/haproxy.cfg, the one config
 * every form of the recipe uses, with its addresses from the environment.
 */
import { createConnection } from 'node:net'
import { waitUntil, type PartSpec } from './parts.js'

export interface HaproxyEnv {
  HAPROXY_HTTPS_BIND: string
  HAPROXY_TLS_CERT: string
  HAPROXY_STATS_BIND: string
  HAPROXY_STATS_SOCKET: string
  GATEWAY_1: string
  GATEWAY_2: string
  GATEWAY_3: string
}

/** One command on the admin socket (`show stat`, `show servers state`); its whole answer. */
export async function haproxyCommand (socketPath: string, command: string): Promise<string> {
  return await new Promise((resolve, reject) => {
    const socket = createConnection(socketPath)
    let answer = ''
    socket.setEncoding('utf8')
    socket.setTimeout(2_000, () => socket.destroy(new Error(`haproxy socket ${socketPath}: no answer to ${command}`)))
    socket.on('connect', () => socket.end(`${command}\n`))
    socket.on('data', (chunk: string) => { answer += chunk })
    socket.on('end', () => resolve(answer))
    socket.on('error', reject)
  })
}

/**
 * Each gateway's check status as haproxy sees it, from `show stat` (CSV):
 * "UP", "DOWN", or a transition such as "UP 1/2" (one failed check of two).
 */
export async function gatewayStates (socketPath: string): Promise<Record<string, string>> {
  const csv = await haproxyCommand(socketPath, 'show stat')
  const lines = csv.split('\n')
  const header = (lines[0] ?? '').replace(/^# /, '').split(',')
  const [px, sv, st] = [header.indexOf('pxname'), header.indexOf('svname'), header.indexOf('status')]
  const states: Record<string, string> = {}
  for (const line of lines.slice(1)) {
    const cols = line.split(',')
    if (cols[px] === 'gateways' && cols[sv] !== 'BACKEND' && cols[sv] !== undefined) states[cols[sv]!] = cols[st] ?? ''
  }
  return states
}

export async function waitGatewaysUp (socketPath: string, names?: string[], timeoutMs = 60_000): Promise<void> {
  await waitUntil(`haproxy seeing ${names?.join(', ') ?? 'every gateway'} UP`, async () => {
    const states = await gatewayStates(socketPath)
    const wanted = names ?? Object.keys(states)
    return wanted.length > 0 && wanted.every((n) => states[n] === 'UP')
  }, timeoutMs)
}

export function haproxySpec (configFile: string, env: HaproxyEnv): PartSpec {
  return {
    name: 'haproxy',
    command: 'haproxy',
    // -db: stay in the foreground, so the pid we hold is haproxy's.
    args: ['-db', '-f', configFile],
    env: { ...env },
    ready: async () => await waitGatewaysUp(env.HAPROXY_STATS_SOCKET)
  }
}
