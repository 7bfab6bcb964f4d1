/**
 * Another user's ping latency under the slow-upload attack (DECISIONS
 * 23): `--attackers` creates (one per user, so no per-user cap
 * applies) send their fields and the image's first 4 KiB, then one byte every
 * `--trickle-s` seconds; each one refused or cut off opens again 1 s later
 * (the `Retry-After` of the refusals). Meanwhile a
 * victim user sends a ping every 50 ms (open loop: sent whether or not the
 * last one has answered) for `--seconds`, and its latency is reported.
 *
 * npx tsc -p bench && node dist/bench/slow-upload-attack.js [--gateway dist/src/server.js] [--attackers 130] [--seconds
 * 30]
 *
 * `--gateway` runs another build's server (e.g. main's, built in a copy) for a
 * before/after comparison. The engine is the fast mock (fixtures/mock-upstream.ts),
 * a process of its own; the gateway runs as in production (128 engine connections).
 */
import { createHmac } from 'node:crypto'
import { spawn } from 'node:child_process'
import { connect, type Socket } from 'node:net'
import path from 'node:path'
import { parseArgs } from 'node:util'
import { Agent, request } from 'undici'
import { GATEWAY_SCRIPT, freePort, startMock, stopAll, waitForOk } from './processes.js'

const { values } = parseArgs({
  options: {
    gateway: { type: 'string', default: GATEWAY_SCRIPT },
    attackers: { type: 'string', default: '130' },
    seconds: { type: 'string', default: '30' },
    'trickle-s': { type: 'string', default: '50' },
    'warmup-s': { type: 'string', default: '3' }
  }
})
const ATTACKERS = Number(values.attackers)
const SECONDS = Number(values.seconds)
const TRICKLE_MS = Number(values['trickle-s']) * 1000
const SECRET = 'bench-secret-bench-secret-bench-secret-0'

function token (sub: string): string {
  const b64 = (v: unknown): string => Buffer.from(JSON.stringify(v)).toString('base64url')
  const now = Math.floor(Date.now() / 1000)
  const input = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64({ sub, iat: now, exp: now + 3600 })}`
  return `${input}.${createHmac('sha256', SECRET).update(input).digest('base64url')}`
}

const BOUNDARY = 'attack-boundary'
const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])
const HEAD = Buffer.concat([
  Buffer.from(
    `--${BOUNDARY}\r\nContent-Disposition: form-data; name="name"\r\n\r\nSlow\r\n` +
      `--${BOUNDARY}\r\nContent-Disposition: form-data; name="type"\r\n\r\nPORTFOLIO\r\n` +
      `--${BOUNDARY}\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\nContent-Type: image/png\r\n\r\n`
  ),
  PNG_SIGNATURE,
  Buffer.alloc(4096, 0x42)
])

let stopping = false
const attack = { opened: 0, answered: new Map<string, number>() }

/** One attacker: a create that trickles; when the gateway answers or closes, a new one. */
function attacker (port: number, sub: string): void {
  if (stopping) return
  const socket: Socket = connect(port, '127.0.0.1')
  attack.opened++
  let timer: NodeJS.Timeout | undefined
  let seen = ''
  socket.on('connect', () => {
    socket.write(
      `POST /api/portfolio/create HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer ${token(sub)}\r\n` +
        `content-type: multipart/form-data; boundary=${BOUNDARY}\r\ncontent-length: ${1024 * 1024}\r\n\r\n`
    )
    socket.write(HEAD)
    timer = setInterval(() => socket.write('B'), TRICKLE_MS)
  })
  socket.on('data', (chunk: Buffer) => {
    if (seen === '') {
      seen = chunk.toString('latin1', 0, 12)
      const status = seen.slice(9, 12)
      attack.answered.set(status, (attack.answered.get(status) ?? 0) + 1)
    }
  })
  socket.on('error', () => {})
  socket.on('close', () => {
    clearInterval(timer)
    // Back after the Retry-After every refusal carries (1 s): a slow-upload attack, not a request flood.
    setTimeout(() => attacker(port, sub), 1000)
  })
}

function percentile (sorted: number[], p: number): number {
  if (sorted.length === 0) return NaN
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!
}

async function main (): Promise<void> {
  const engine = await startMock()
  const port = await freePort()
  const gateway = spawn(process.execPath, [path.resolve(values.gateway)], {
    env: {
      PATH: process.env.PATH,
      NODE_ENV: 'production',
      HOST: '127.0.0.1',
      PORT: String(port),
      UPSTREAM_URL: engine.url,
      JWT_SECRET: SECRET,
      METRICS_PORT: '0',
      LOG_LEVEL: 'warn',
      // The victim's pings must not meet its own rate limit.
      RATE_LIMIT_PER_MINUTE: '0'
    },
    stdio: ['ignore', 'ignore', 'inherit']
  })
  const url = `http://127.0.0.1:${port}`
  try {
    await waitForOk(`${url}/health`, 20_000)
    for (let i = 0; i < ATTACKERS; i++) attacker(port, `attacker-${i}`)
    await new Promise((resolve) => setTimeout(resolve, Number(values['warmup-s']) * 1000))

    const victim = { authorization: `Bearer ${token('victim')}` }
    const dispatcher = new Agent({ connections: 64 })
    const latencies: number[] = []
    const statuses = new Map<string, number>()
    const pending: Array<Promise<void>> = []
    const end = performance.now() + SECONDS * 1000
    while (performance.now() < end) {
      pending.push(
        (async () => {
          const begun = performance.now()
          let status: string
          try {
            const res = await request(`${url}/api/portfolio/ping`, {
              headers: victim,
              dispatcher,
              headersTimeout: 60_000
            })
            await res.body.dump()
            status = String(res.statusCode)
          } catch (err) {
            status = (err as { code?: string }).code ?? 'error'
          }
          latencies.push(performance.now() - begun)
          statuses.set(status, (statuses.get(status) ?? 0) + 1)
        })()
      )
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
    await Promise.all(pending)
    await dispatcher.close()
    latencies.sort((a, b) => a - b)
    console.log(
      JSON.stringify({
        gateway: values.gateway,
        attackers: ATTACKERS,
        seconds: SECONDS,
        pings: latencies.length,
        statuses: Object.fromEntries(statuses),
        ping_ms: {
          p50: +percentile(latencies, 50).toFixed(1),
          p99: +percentile(latencies, 99).toFixed(1),
          max: +latencies[latencies.length - 1]!.toFixed(1)
        },
        attack: { creates_opened: attack.opened, answers: Object.fromEntries(attack.answered) }
      })
    )
  } finally {
    stopping = true
    gateway.kill('SIGKILL')
    await stopAll()
  }
}

await main()
process.exit(0)
