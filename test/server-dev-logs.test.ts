/**
 * Logs a developer can read: `npm start` (dist/src/server.js) in development
 * at a terminal prints pino-pretty lines, and the token banner stays as it
 * is; piped, or in production, every line is JSON for a log shipper.
 * The terminal is a real pseudo-terminal: util-linux `script`.
 */
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { existsSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import t, { type Test } from 'tap'
import { ROOT } from './helpers/processes.js'
import { client, gatewayUrl, lines, SERVER, start, WAIT_MS } from './helpers/gateway-process.js'
import { request } from 'undici'

const SCRIPT = '/usr/bin/script'
// eslint-disable-next-line no-control-regex
const ANSI = /\x1b\[[0-9;]*m/g

/** dist/src/server.js under a pseudo-terminal with only PATH and `env`; its output with colours and CRs removed. */
function startAtTerminal (
  t: Test,
  env: Record<string, string>
): { out: () => string; waitFor: (pattern: RegExp) => Promise<void>; stop: () => Promise<void> } {
  // exec: the gateway is script's own child, so the test can stop it itself.
  const proc = spawn(
    SCRIPT,
    ['-qfec', `exec ${JSON.stringify(process.execPath)} ${JSON.stringify(SERVER)}`, '/dev/null'],
    {
      cwd: ROOT,
      env: { PATH: process.env['PATH'] ?? '', METRICS_PORT: '0', PORT: '0', ...env },
      stdio: ['ignore', 'pipe', 'pipe']
    }
  )
  let raw = ''
  proc.stdout.setEncoding('utf8').on('data', (chunk: string) => {
    raw += chunk
  })
  proc.stderr.setEncoding('utf8').on('data', (chunk: string) => {
    raw += chunk
  })
  const exited = once(proc, 'exit')
  const out = (): string => raw.replace(ANSI, '').replace(/\r/g, '')
  const stop = async (): Promise<void> => {
    if (proc.exitCode === null && proc.signalCode === null) {
      // The gateway first: once its terminal is gone it could only fail to write. script then exits.
      const children = await readFile(`/proc/${proc.pid!}/task/${proc.pid!}/children`, 'utf8').catch(() => '')
      for (const pid of children.split(' ').filter((p) => p !== '')) {
        try {
          process.kill(Number(pid), 'SIGKILL')
        } catch {
          /* already gone */
        }
      }
      proc.kill('SIGKILL')
      await exited
    }
  }
  t.teardown(stop)
  const waitFor = async (pattern: RegExp): Promise<void> => {
    const deadline = Date.now() + WAIT_MS
    while (!pattern.test(out())) {
      if (proc.exitCode !== null || Date.now() > deadline) { throw new Error(`no ${String(pattern)} in the output:\n${out()}`) }
      await new Promise((resolve) => setTimeout(resolve, 20))
    }
  }
  return { out, waitFor, stop }
}

const skip = !existsSync(SCRIPT)
  ? `${SCRIPT} is not installed (util-linux)`
  : !existsSync(SERVER)
      ? `${SERVER} is missing: run \`npm run build\``
      : false

t.test('development at a terminal: readable lines, the token banner as it is', { skip }, async (t) => {
  const gateway = startAtTerminal(t, { JWT_SECRET: 'x'.repeat(40), LOG_LEVEL: 'info' })
  await gateway.waitFor(/gateway ready/)
  const text = gateway.out()
  const ready = lines(text).find((l) => l.includes('gateway ready'))
  // pino-pretty: [HH:MM:ss.mmm] LEVEL: message, then the fields indented below it.
  t.match(ready, /^\[\d{2}:\d{2}:\d{2}\.\d{3}\] INFO: gateway ready$/, 'a pretty line')
  t.match(
    text,
    /\n {4}upstream: "embedded reference engine at http:\/\/127\.0\.0\.1:\d+"\n/,
    'its fields, one per line'
  )
  t.notMatch(text, /^\{"level"/m, 'no JSON line')
  // The gateway's own line: the embedded engine says "INFO (engine): Server listening" first.
  const port = /INFO: Server listening at http:\/\/127\.0\.0\.1:(\d+)/.exec(text)?.[1]
  t.ok(port, 'the gateway says where it listens')
  // A request's access line is readable too, with its id.
  const answer = await request(`http://127.0.0.1:${port!}/health`, {
    headers: { 'x-request-id': 'dev-1' },
    dispatcher: client(t)
  })
  await answer.body.dump()
  await gateway.waitFor(/INFO: request\n/)
  t.match(
    gateway.out(),
    /INFO: request\n {4}reqId: "dev-1"\n {4}traceId: "[0-9a-f]{32}"\n {4}method: "GET"\n {4}url: "\/health"\n/,
    'the access line, fields below it'
  )
  await gateway.stop()
})

t.test('development with no key at a terminal: the token banner is plain text', { skip }, async (t) => {
  const gateway = startAtTerminal(t, {})
  await gateway.waitFor(/curl -H "Authorization: Bearer \$TOKEN"/)
  t.match(
    gateway.out(),
    /\nDevelopment mode: no JWT_SECRET or JWT_PUBLIC_KEY set, so a random HS256 secret was generated\.\n/
  )
  t.match(gateway.out(), /\n {2}export TOKEN=[\w-]+\.[\w-]+\.[\w-]+\n/)
  await gateway.stop()
})

t.test('piped: every line is JSON', { skip }, async (t) => {
  const child = start(t, SERVER, { JWT_SECRET: 'x'.repeat(40), PORT: '0', LOG_LEVEL: 'info' })
  await gatewayUrl(child)
  await child.waitForOutput(/gateway ready/)
  const logged = lines(child.out())
  t.ok(logged.length >= 2, 'some lines')
  for (const line of logged) {
    t.match(
      JSON.parse(line) as Record<string, unknown>,
      { level: Number, time: Number, msg: String },
      line.slice(0, 60)
    )
  }
})

t.test('production at a terminal: JSON still', { skip }, async (t) => {
  const gateway = startAtTerminal(t, {
    NODE_ENV: 'production',
    JWT_SECRET: 'x'.repeat(40),
    UPSTREAM_URL: 'http://127.0.0.1:9',
    LOG_LEVEL: 'info'
  })
  await gateway.waitFor(/gateway ready/)
  const ready = lines(gateway.out()).find((l) => l.includes('gateway ready'))
  t.match(JSON.parse(ready ?? '{}') as Record<string, unknown>, {
    level: 30,
    msg: 'gateway ready',
    upstream: 'http://127.0.0.1:9'
  })
})
