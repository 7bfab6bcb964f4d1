/**
 * HTTP/2 against HTTP/1.1 through haproxy, in the same run: h2load (nghttp2-client) over TLS with ALPN h2, then
 * autocannon over
 * TLS with HTTP/1.1, both on /api/portfolio/ping with a token, same number of
 * connections and the same duration. Neither client verifies the
 * certificate (autocannon cannot be told a CA); both speak to haproxy.
 *
 * Ping is limited like every /api route (600 per user per minute by
 * default), so the figures need a topology whose gateways run with
 * RATE_LIMIT_PER_MINUTE=0: `npm run deploy:local -- --bench` starts one of its own.
 */
import { execFile } from 'node:child_process'
import { promisify } from 'node:util'
import autocannon from 'autocannon'
import { mintToken, type TopologyInfo } from './topology.js'
import { readFileSync } from 'node:fs'

const run = promisify(execFile)

export interface Figures {
  client: string
  requestsPerSecond: number
  ok: number
  failed: number
  /** ms */
  meanLatency: number
  /** What the failures were: "5xx x12", "503 x3", "errors x2". */
  failures: string
}

export interface FigureOptions {
  connections: number
  /** h2 streams per connection (h2load -m); HTTP/1.1 gets one request at a time per connection. */
  streams: number
  durationS: number
}

const DEFAULTS: FigureOptions = { connections: 4, streams: 8, durationS: 10 }

/** h2load's summary lines: "finished in 10.00s, 5000.10 req/s", "requests: ... 123 succeeded, 0 failed", "time for
 * request: min max mean".
 */
export function parseH2load (out: string): Omit<Figures, 'client'> {
  const rate = /finished in [\d.]+\w*, ([\d.]+) req\/s/.exec(out)
  // "failed" counts HTTP-level failures (4xx, 5xx) too; "errored" and "timeout" got no answer.
  const requests =
    /requests: \d+ total, \d+ started, \d+ done, \d+ succeeded, (\d+) failed, (\d+) errored, (\d+) timeout/.exec(out)
  const status = /status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx/.exec(out)
  const time = /time for request:\s+(\S+)\s+(\S+)\s+(\S+)/.exec(out)
  if (rate === null || requests === null || status === null || time === null) { throw new Error(`h2load's output was not understood:\n${out}`) }
  const ms = (v: string): number =>
    v.endsWith('us')
      ? Number(v.slice(0, -2)) / 1000
      : v.endsWith('ms')
        ? Number(v.slice(0, -2))
        : Number(v.slice(0, -1)) * 1000
  const noAnswer = Number(requests[1]) - Number(status[3]) - Number(status[4])
  const failures = [
    ['4xx', status[3]],
    ['5xx', status[4]],
    ['no answer', noAnswer]
  ]
    .filter(([, n]) => Number(n) > 0)
    .map(([what, n]) => `${String(what)} x${String(n)}`)
    .join(', ')
  return {
    requestsPerSecond: Number(rate[1]),
    ok: Number(status[1]),
    failed: Number(requests[1]),
    meanLatency: ms(time[3]!),
    failures
  }
}

export async function h2loadFigures (info: TopologyInfo, token: string, o: FigureOptions): Promise<Figures> {
  const { stdout } = await run(
    'h2load',
    [
      '-c',
      String(o.connections),
      '-m',
      String(o.streams),
      '-t',
      '1',
      '-D',
      String(o.durationS),
      '--warm-up-time',
      '1',
      '-H',
      `authorization: Bearer ${token}`,
      `https://127.0.0.1:${info.ports.https}/api/portfolio/ping`
    ],
    { timeout: (o.durationS + 30) * 1000, maxBuffer: 1 << 20 }
  )
  return {
    client: `h2load, HTTP/2 over TLS, ${o.connections} connections x ${o.streams} streams`,
    ...parseH2load(stdout)
  }
}

export async function autocannonFigures (info: TopologyInfo, token: string, o: FigureOptions): Promise<Figures> {
  const result = await new Promise<autocannon.Result>((resolve, reject) => {
    // The same number of requests in flight as h2load: connections x streams, one at a time each.
    autocannon(
      {
        url: `https://127.0.0.1:${info.ports.https}/api/portfolio/ping`,
        connections: o.connections * o.streams,
        duration: o.durationS,
        headers: { authorization: `Bearer ${token}` }
      },
      (err, res) => {
        if (err === null) resolve(res)
        else reject(err)
      }
    )
  })
  return {
    client: `autocannon, HTTP/1.1 over TLS, ${o.connections * o.streams} connections`,
    requestsPerSecond: result.requests.average,
    ok: result['2xx'],
    failed: result.non2xx + result.errors + result.timeouts,
    meanLatency: result.latency.mean,
    failures: [
      ...Object.entries(result.statusCodeStats)
        .filter(([code]) => code !== '200')
        .map(([code, { count }]) => `${code} x${count}`),
      ...(result.errors > 0 ? [`errors x${result.errors}`] : []),
      ...(result.timeouts > 0 ? [`timeouts x${result.timeouts}`] : [])
    ].join(', ')
  }
}

export async function runFigures (
  info: TopologyInfo,
  print: (line: string) => void,
  options: Partial<FigureOptions> = {}
): Promise<Figures[]> {
  const o = { ...DEFAULTS, ...options }
  const token = mintToken(readFileSync(info.secretFile, 'utf8').trim(), 'bench')
  print(`GET /api/portfolio/ping through haproxy at ${info.url}, ${o.durationS} s each, one after the other`)
  const figures = [await h2loadFigures(info, token, o), await autocannonFigures(info, token, o)]
  print('| client | req/s | 2xx | failed | mean latency | failures |')
  print('|---|---:|---:|---:|---:|---|')
  for (const f of figures) {
    print(
      `| ${f.client} | ${Math.round(f.requestsPerSecond)} | ${f.ok} | ${f.failed} | ${f.meanLatency.toFixed(2)} ms | ${f.failures || '-'} |`
    )
  }
  return figures
}
