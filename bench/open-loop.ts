/**
 * An open-loop load generator, wrk2-style, for the run past saturation.
 * Requests are due at a fixed rate whatever the server does; each
 * one's latency runs from the moment it was due, not from when a connection
 * was free to send it, so time spent waiting behind a slow server counts
 * (the "coordinated omission" a closed loop hides).
 *
 * Not autocannon's `overallRate`: it lets each connection send its share of a
 * second as fast as it can at the start of every second and then idle, so at
 * half the capacity it still offers bursts at full speed.
 */
import { performance } from 'node:perf_hooks'
import { Pool } from 'undici'
import { freshHeaders, type BuiltRequest } from './scenarios.js'

/** Requests waiting in the generator beyond which new ones are counted as not sent (memory bound). */
const MAX_OUTSTANDING = 50_000
/** An answer slower than this counts as an error: far past any latency worth reporting. */
const TIMEOUT_MS = 10_000

export interface OpenLoopResult {
  /** Seconds over which requests were due. */
  durationS: number
  /** Seconds from the first request due to the last answer: the rates divide by this. */
  elapsedS: number
  due: number
  /** Due but never sent: the generator's own queue was full. */
  notSent: number
  statusCodes: Record<string, number>
  errors: number
  /** ms from due to the last byte of the answer, sorted: all answers, and the 2xx ones. */
  latencies: Float64Array
  accepted: Float64Array
}

/** Answers of every status received (sent requests that errored or were never sent are not answers). */
export function answeredOf (run: OpenLoopResult): number {
  return Object.values(run.statusCodes).reduce((n, c) => n + c, 0)
}

export async function openLoop (
  url: string,
  request: BuiltRequest,
  rate: number,
  durationS: number,
  connections: number
): Promise<OpenLoopResult> {
  const pool = new Pool(url, {
    connections,
    pipelining: 1,
    headersTimeout: TIMEOUT_MS,
    bodyTimeout: TIMEOUT_MS,
    keepAliveTimeout: 60_000
  })
  const total = Math.max(1, Math.round(rate * durationS))
  const statusCodes: Record<string, number> = {}
  const all: number[] = []
  const ok: number[] = []
  let errors = 0
  let notSent = 0
  let outstanding = 0
  let settled: (() => void) | undefined

  const send = (due: number): void => {
    outstanding++
    pool
      .request({
        path: request.path,
        method: request.method,
        headers: { ...request.headers, ...freshHeaders(request.fresh ?? []) },
        ...(request.body === undefined ? {} : { body: request.body })
      })
      .then(
        async (res) => {
          await res.body.dump()
          const ms = performance.now() - due
          statusCodes[res.statusCode] = (statusCodes[res.statusCode] ?? 0) + 1
          all.push(ms)
          if (res.statusCode >= 200 && res.statusCode < 300) ok.push(ms)
        },
        () => {
          errors++
        }
      )
      .finally(() => {
        outstanding--
        if (outstanding === 0) settled?.()
      })
  }

  const start = performance.now()
  let scheduled = 0
  await new Promise<void>((resolve) => {
    // Every millisecond, send what has come due since the last tick.
    const timer = setInterval(() => {
      const due = Math.min(total, Math.floor(((performance.now() - start) / 1000) * rate))
      for (; scheduled < due; scheduled++) {
        if (outstanding >= MAX_OUTSTANDING) notSent++
        else send(start + (scheduled * 1000) / rate)
      }
      if (scheduled >= total) {
        clearInterval(timer)
        resolve()
      }
    }, 1)
  })
  if (outstanding > 0) {
    await new Promise<void>((resolve) => {
      settled = resolve
    })
  }
  const elapsedS = (performance.now() - start) / 1000
  await pool.close()
  const sorted = (values: number[]): Float64Array => Float64Array.from(values).sort()
  return { durationS, elapsedS, due: total, notSent, statusCodes, errors, latencies: sorted(all), accepted: sorted(ok) }
}
