/**
 * A dead or hanging collector (DECISIONS 29): export is bounded and lossy, so
 * requests are unaffected, the spans waiting for export never pass the queue's
 * bound, and every span that could not leave is counted in
 * gateway_trace_spans_dropped_total.
 *
 * The latency comparison runs the untraced and the traced gateway (the
 * default sampler, as in production) side by side against one engine, each
 * client connection sending to both in turn, and compares the medians of the
 * rounds' p99: a busy machine slows both alike. A burst of requests whose
 * client sampled them then fills the export queue, to show its bound and the count.
 *
 * What the comparison can see: a traced request that waits on the collector
 * (an export's timeout is 300 ms; a wait of tens of milliseconds fails it).
 * What it cannot: a CPU cost of tracing. Both gateways, the engine and the
 * client share this process's event loop, so CPU spent for the traced
 * gateway delays the untraced one's requests alike (a review's 2 ms
 * busy-wait per traced request passed). The CPU cost of tracing is measured
 * by the benchmark (`prod-ping-traced` against `prod-ping`). Gateways as
 * separate processes would see it, but on two shared cores each process's
 * own stalls put a first measurement past 10% in about one run in three:
 * tried, not kept.
 */
import type { Test } from 'tap'
import { Pool } from 'undici'
import { bearer, build } from './app.js'
import { startEngine } from './engine.js'
import { tracingFrom } from './tracing.js'
import { startOtlpSink } from '../../bench/otlp-sink.js'
import { freePort } from './processes.js'

const QUEUE_MAX = 64
const ROUNDS = 7
const BURST = 600
const PER_ROUND = 250
const CONCURRENCY = 8

/** `count` pings through `pool`, CONCURRENCY at a time; the latencies in ms. */
async function round (pool: Pool, count: number, extra: Record<string, string> = {}): Promise<number[]> {
  return (await pairedRound([pool], count, extra))[0]!
}

/**
 * `count` pings to each pool, CONCURRENCY workers each sending to every pool
 * in turn (half of them starting with the other): the pools see the same
 * machine at the same moments, so a busy neighbour slows them alike.
 */
async function pairedRound (
  pools: readonly Pool[], count: number, extra: Record<string, string> = {}
): Promise<number[][]> {
  const headers = { ...bearer(), ...extra }
  const latencies: number[][] = pools.map(() => [])
  let left = count
  const worker = async (w: number): Promise<void> => {
    while (left-- > 0) {
      for (let k = 0; k < pools.length; k++) {
        const which = (k + w) % pools.length
        const started = performance.now()
        const res = await pools[which]!.request({ method: 'GET', path: '/api/portfolio/ping', headers })
        await res.body.dump()
        if (res.statusCode !== 200) throw new Error(`ping answered ${res.statusCode}`)
        latencies[which]!.push(performance.now() - started)
      }
    }
  }
  await Promise.all(Array.from({ length: CONCURRENCY }, (_, w) => worker(w)))
  return latencies
}

const p99 = (values: number[]): number => [...values].sort((a, b) => a - b)[Math.ceil(values.length * 0.99) - 1]!
const median = (values: number[]): number => {
  const s = [...values].sort((a, b) => a - b)
  return s[Math.floor(s.length / 2)]!
}

function droppedOf (scrape: string): number {
  return Number(/^gateway_trace_spans_dropped_total (\d+)/m.exec(scrape)?.[1] ?? NaN)
}

export async function collectorFailure (t: Test, collector: 'down' | 'hanging'): Promise<void> {
  let endpoint: string
  if (collector === 'down') {
    endpoint = `http://127.0.0.1:${await freePort()}`
  } else {
    const sink = await startOtlpSink({ mode: 'hang' })
    t.teardown(async () => { await sink.close() })
    endpoint = sink.url
  }
  const engine = await startEngine(t)
  const env = { OTEL_EXPORTER_OTLP_ENDPOINT: endpoint }
  const tracing = tracingFrom(t, env, 'portfolio-gateway', { queueMax: QUEUE_MAX, exportDelayMs: 20, exportTimeoutMs: 300 })
  const plain = await build(t, { upstreamUrl: engine.origin, env: { RATE_LIMIT_PER_MINUTE: '0', UPSTREAM_TIMEOUT_MS: '10000' } })
  const traced = await build(t, { upstreamUrl: engine.origin, env: { ...env, RATE_LIMIT_PER_MINUTE: '0', UPSTREAM_TIMEOUT_MS: '10000', TRUST_PROXY: '127.0.0.1' }, tracing })
  const pools = [
    new Pool(plain.url, { connections: CONCURRENCY }),
    new Pool(traced.url, { connections: CONCURRENCY })
  ] as const
  t.teardown(async () => { await Promise.all(pools.map(async (p) => await p.close())) })

  // Warm both: connections, the JIT, the engine's pool (the first rounds of a process are its slowest).
  await pairedRound(pools, 300)
  let maxPending = 0
  const measure = async (): Promise<{ untraced: number, withTracing: number }> => {
    const p99s: [number[], number[]] = [[], []]
    for (let r = 0; r < ROUNDS; r++) {
      const [untracedRound, tracedRound] = await pairedRound(pools, PER_ROUND)
      p99s[0].push(p99(untracedRound!))
      p99s[1].push(p99(tracedRound!))
      maxPending = Math.max(maxPending, tracing.pending)
    }
    const [untraced, withTracing] = [median(p99s[0]), median(p99s[1])]
    t.comment(`p99 medians over ${ROUNDS} rounds of ${PER_ROUND}: untraced ${untraced.toFixed(2)} ms, traced to a ${collector} collector ${withTracing.toFixed(2)} ms`)
    return { untraced, withTracing }
  }
  // The two p99s usually agree within 1%. A measurement past 10% is taken again once: on a shared runner
  // one in a few dozen met a burst from elsewhere (13% once, the next run of the same build within 1%);
  // a request that waits on the collector fails both.
  let { untraced, withTracing } = await measure()
  if (withTracing > untraced * 1.10) ({ untraced, withTracing } = await measure())
  t.ok(withTracing <= untraced * 1.10, `traced p99 ${withTracing.toFixed(2)} ms within 10% of untraced ${untraced.toFixed(2)} ms`)

  // The burst: every request sampled by its client's traceparent (followed: the client is a TRUST_PROXY peer).
  const sampled = { traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' }
  for (let i = 0; i < BURST / 100; i++) {
    await round(pools[1], 100, sampled)
    maxPending = Math.max(maxPending, tracing.pending)
  }
  t.ok(maxPending <= QUEUE_MAX, `spans held never passed the bound (${maxPending} <= ${QUEUE_MAX})`)
  const requests = BURST
  // Every span ended either waits (pending) or was dropped: none was exported (the latency rounds' 1% add a few).
  const dropped = droppedOf((await traced.metrics.scrape()).body)
  t.ok(dropped + tracing.pending >= requests, `every span is dropped or waiting (${dropped} dropped + ${tracing.pending} waiting, ${requests} requests)`)
  t.ok(dropped >= requests - QUEUE_MAX, 'the drops are counted')
  t.equal(droppedOf((await plain.metrics.scrape()).body), 0, 'the untraced gateway has the series at 0')
}
