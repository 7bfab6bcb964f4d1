/**
 * What each client gets for each refusal of a create (and update's 400 past
 * its body limit), small form and 9 MiB: the table of DECISIONS 21.
 *
 *   npx tsc -p bench && node dist/bench/refusals.js [--gateway-root DIR] [--rate BYTES_PER_S]
 *
 * The gateway runs in this process, built from DIR's dist/ (default: this
 * tree), so the same requests can be sent to an older build: check it out
 * with `git worktree add`, build it there, and pass its directory. The
 * clients (python3's http.client, a raw socket, undici's fetch, curl) and
 * the engine double are this tree's (test/helpers/write-first.ts,
 * test/helpers/refusals.ts). One refusal at a time, its clients all at once.
 * With `--rate`, python, the raw socket and curl send their bodies paced to it
 * (a phone on a slow link); undici's fetch cannot pace a sized body, and sends
 * at full speed.
 */
import { resolve } from 'node:path'
import { pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import { REFUSALS, SIZES, UPDATE_TOO_LARGE, readItsAnswer, runRefusal, type Run, type SizeName, type StartGateway } from '../test/helpers/refusals.js'
import { SECRET } from '../test/helpers/app.js'
import { CLIENTS, describe } from '../test/helpers/write-first.js'

const { values } = parseArgs({
  options: {
    'gateway-root': { type: 'string', default: resolve(import.meta.dirname, '..', '..') },
    rate: { type: 'string' }
  }
})
const rate = values.rate === undefined ? undefined : Number(values.rate)
if (rate !== undefined && !(rate > 0)) throw new Error(`--rate ${values.rate}: expected bytes per second, e.g. 204800`)
const root = resolve(values['gateway-root'])
const load = async <T>(file: string): Promise<T> => await import(pathToFileURL(resolve(root, 'dist', 'src', file)).href) as T

const { compose } = await load<typeof import('../src/compose.js')>('compose.js')
const { loadConfig } = await load<typeof import('../src/config.js')>('config.js')

/** As test/helpers/app.ts's build(), from the chosen build (one with src/compose.ts). */
const start: StartGateway = async (upstreamUrl, setup) => {
  const env = { JWT_SECRET: SECRET, UPSTREAM_URL: upstreamUrl, UPSTREAM_TIMEOUT_MS: '1000', SHED_EVENT_LOOP_DELAY_MS: '0' }
  const { uploadStallTimeoutMs } = setup
  const gateway = await compose(loadConfig({ ...env, ...setup.env }), {
    engine: { keepAliveTimeoutMs: 500 },
    app: uploadStallTimeoutMs === undefined ? {} : { uploadStallTimeoutMs }
  })
  await gateway.engine.ready()
  const url = await gateway.app.listen({ port: 0, host: '127.0.0.1' })
  return { url, close: gateway.close }
}

const sizes = Object.keys(SIZES) as SizeName[]
const clients = Object.keys(CLIENTS)
const cell = (run: Run): string => readItsAnswer(run) ? `${run.outcome.status!} read, ${run.outcome.ms} ms` : describe(run.outcome).replace(/\|/g, '/').slice(0, 80)
const lines = [`gateway: ${root}`, `rate: ${rate === undefined ? 'full speed' : `${rate} bytes/s`}`, '',
  `| refusal | size | ${clients.join(' | ')} |`, `|---|---|${clients.map(() => '---|').join('')}`]
let read = 0
let all = 0
for (const refusal of [...REFUSALS, UPDATE_TOO_LARGE]) {
  const runs = await runRefusal(start, refusal, CLIENTS, sizes, rate === undefined ? {} : { rate })
  for (const size of sizes) {
    const row = clients.map((client) => runs.find((r) => r.client === client && r.size === size)!)
    read += row.filter(readItsAnswer).length
    all += row.length
    lines.push(`| ${refusal.name} (${refusal.status}) | ${size} | ${row.map(cell).join(' | ')} |`)
  }
  process.stderr.write(`${refusal.name} done\n`)
}
lines.push('', `${read}/${all} exchanges read their exact answer`)
console.log(lines.join('\n'))
// Clients' sockets and timers are all closed; exit without waiting for pools to idle out.
process.exit(0)
