/**
 * `npm run deploy:local` starts the topology (deploy/local/topology.ts) and
 * returns to the shell with it running; it prints the URL, a token and how
 * to stop it.
 *   npm run deploy:local -- --stop        stop what a previous start left running
 *   npm run deploy:local -- --bench       h2load (HTTP/2) against autocannon (HTTP/1.1) through haproxy,
 *                                         on a topology of its own (rate limit off), stopped afterwards
 *   --run-dir DIR   state (pids, logs, certificates); default $TMPDIR/portfolio-gateway-local
 *   --base-port N   fixed ports from N (see README); default: free ports
 */
import { existsSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { runFigures } from './figures.js'
import { stopFromPidFile } from './parts.js'
import { mintToken, readTopologyInfo, startTopology, STOP_WAVES } from './topology.js'

/** dist/deploy/local/main.js -> the repository. */
const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..')

function fail (message: string): never {
  process.stderr.write(`deploy:local: ${message}\n`)
  process.exit(1)
}

let values
try {
  ({ values } = parseArgs({
    options: {
      stop: { type: 'boolean', default: false },
      bench: { type: 'boolean', default: false },
      'run-dir': { type: 'string', default: join(tmpdir(), 'portfolio-gateway-local') },
      'base-port': { type: 'string' }
    }
  }))
} catch (err) {
  fail(`${(err as Error).message}; usage: npm run deploy:local [-- --stop | --bench] [--run-dir DIR] [--base-port N]`)
}
const runDir = resolve(values['run-dir'])

if (values.stop) {
  const stopped = await stopFromPidFile(runDir, STOP_WAVES)
  process.stdout.write(stopped.length === 0 ? `nothing running from ${runDir}\n` : `stopped ${stopped.join(', ')}\n`)
  process.exit(0)
}

if (values.bench) {
  // A topology of its own, with the per-user rate limit off (the figures use one token), stopped afterwards.
  const topology = await startTopology({ runDir: `${runDir}-bench`, root: ROOT, detached: false, gatewayEnv: { RATE_LIMIT_PER_MINUTE: '0' }, log: (line) => process.stdout.write(`starting ${line}\n`) })
    .catch((err: Error) => fail(err.message))
  try {
    await runFigures(topology, (line) => process.stdout.write(line + '\n'))
  } finally {
    await topology.stop()
  }
  process.exit(0)
}

const basePort = values['base-port'] === undefined ? undefined : Number(values['base-port'])
if (basePort !== undefined && !(Number.isInteger(basePort) && basePort > 0 && basePort < 65_490)) fail('--base-port must be an integer from 1 to 65489 (the topology uses 46 ports from it)')
for (const tool of ['haproxy', 'redis-server', 'redis-sentinel', 'prometheus', 'openssl']) {
  if (!['/usr/bin', '/usr/sbin', '/bin', '/sbin', '/usr/local/bin'].some((d) => existsSync(join(d, tool)))) {
    fail(`${tool} not found: apt-get install haproxy redis-server redis-sentinel prometheus openssl (Debian 12 or later)`)
  }
}
if (readTopologyInfo(runDir) !== undefined && await stopFromPidFile(runDir, STOP_WAVES).then((s) => s.length > 0)) {
  process.stdout.write(`stopped what an earlier start left running in ${runDir}\n`)
}

try {
  const topology = await startTopology({
    runDir,
    root: ROOT,
    detached: true,
    ...(basePort === undefined ? {} : { basePort }),
    log: (line) => process.stdout.write(`starting ${line}\n`)
  })
  const { ports } = topology
  const token = mintToken(topology.jwtSecret, 'alice')
  process.stdout.write([
    '',
    `Running, state in ${runDir} (logs/, pids.json)`,
    '',
    `  gateway through haproxy (TLS 1.3, h2 or http/1.1): ${topology.url}`,
    `  haproxy stats:  http://127.0.0.1:${ports.haproxyAdmin}/stats   prometheus: http://127.0.0.1:${ports.prometheus}`,
    `  gateways: ${ports.gateways.join(', ')} (metrics ${ports.gatewayMetrics.join(', ')})   engines: ${ports.engines.join(', ')}`,
    `  gateway redis: primary ${ports.redisPrimary}, replica ${ports.redisReplica}, sentinels ${ports.sentinels.join(', ')}   engine redis: ${ports.engineRedis}`,
    '',
    'A token for sub=alice, valid 12 hours:',
    '',
    `  export TOKEN=${token}`,
    `  curl --cacert ${topology.caFile} -H "Authorization: Bearer $TOKEN" ${topology.url}/api/portfolio/ping`,
    '',
    `More tokens: JWT_SECRET=$(cat ${topology.secretFile}) npm run token -- --sub bob`,
    `Stop it:     npm run deploy:local -- --stop${values['run-dir'] === join(tmpdir(), 'portfolio-gateway-local') ? '' : ` --run-dir ${runDir}`}`,
    ''
  ].join('\n'))
  process.exit(0)
} catch (err) {
  fail(`${(err as Error).message}\n(everything started was stopped again)`)
}
