/**
 * The helpers that start gateway processes never leave a port at its default
 * (PORT 3000, METRICS_PORT 9464): a developer's own `npm start` holds those,
 * and a gateway started on them beside it fails. Each helper starts a stand-in
 * script that reports the ports it was given.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { startGateway, stopAll } from '../../bench/processes.js'
import { exitOf, start } from '../helpers/gateway-process.js'
import { freePort, startProcess } from '../helpers/processes.js'

/** Prints the ports it was given, and answers /health on PORT when asked to listen. */
const STAND_IN = `import { createServer } from 'node:http'
const ports = { PORT: process.env.PORT ?? null, METRICS_PORT: process.env.METRICS_PORT ?? null }
console.log('ports ' + JSON.stringify(ports))
if (process.env.STAND_IN_LISTEN === '1') createServer((req, res) => res.end(JSON.stringify(ports))).listen(Number(process.env.PORT), '127.0.0.1')
`
const dir = mkdtempSync(join(tmpdir(), 'default-ports-'))
t.teardown(() => rmSync(dir, { recursive: true, force: true }))
const standIn = join(dir, 'stand-in.mjs')
writeFileSync(standIn, STAND_IN)

const portsIn = (out: string): unknown => JSON.parse(/ports (.*)\n/.exec(out)![1]!)

t.test('start() (test/helpers/gateway-process.ts): any free port, metrics off', async (t) => {
  const child = start(t, standIn, {})
  await exitOf(child)
  t.same(portsIn(child.out()), { PORT: '0', METRICS_PORT: '0' })
})

t.test('startProcess() (test/helpers/processes.ts): metrics off', async (t) => {
  const port = await freePort()
  const proc = await startProcess(t, standIn, { PORT: String(port) }, port, /ports /)
  t.same(portsIn(proc.out()), { PORT: String(port), METRICS_PORT: '0' })
})

t.test('the bench\'s startGateway: metrics off unless a scenario gives them a port, whatever the shell says', async (t) => {
  const saved = process.env['METRICS_PORT']
  process.env['METRICS_PORT'] = '9464'
  t.teardown(async () => {
    if (saved === undefined) delete process.env['METRICS_PORT']
    else process.env['METRICS_PORT'] = saved
    await stopAll()
  })
  const gateway = await startGateway({ upstreamUrl: 'http://127.0.0.1:9', logLevel: 'warn', script: standIn, env: { STAND_IN_LISTEN: '1' } })
  const res = await fetch(`${gateway.url}/health`)
  t.same(await res.json(), { PORT: new URL(gateway.url).port, METRICS_PORT: '0' })
})
