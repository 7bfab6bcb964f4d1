/**
 * autocannon 8 ships no type declarations. This covers only the part of its
 * programmatic API the harness uses (README "API"), so the bench stays strict.
 */
declare module 'autocannon' {
  namespace autocannon {
    interface Options {
      url: string
      connections?: number
      /** Seconds; fractions are allowed. */
      duration?: number
      /** ms between samples (default 1000); the run ends at the first sample after `duration`. */
      sampleInt?: number
      /** Seconds to wait for a response before counting a timeout. */
      timeout?: number
      pipelining?: number
      method?: string
      headers?: Record<string, string>
      body?: string | Buffer
      title?: string
      /** Requests sent in turn; `setupRequest` runs before each one is sent. */
      requests?: Array<{ setupRequest?: (request: RawRequest) => RawRequest, headers?: Record<string, string> }>
    }

    /** The request autocannon is about to send, as `setupRequest` sees it. */
    interface RawRequest {
      method?: string
      path?: string
      headers?: Record<string, string>
      body?: string | Buffer
    }

    /** A histogram summary: values are ms for latency, per second for requests. */
    interface Histogram {
      average: number
      mean: number
      stddev: number
      min: number
      max: number
      total: number
      p50: number
      p90: number
      p99: number
      p99_9: number
    }

    interface Result {
      title?: string
      url: string
      connections: number
      /** Seconds. */
      duration: number
      latency: Histogram
      requests: Histogram & { sent: number }
      throughput: Histogram
      errors: number
      timeouts: number
      mismatches: number
      non2xx: number
      resets: number
      '2xx': number
      statusCodeStats: Record<string, { count: number }>
    }

    interface Instance {
      stop (): void
      /** Every completed response; `responseTime` is in ms with sub-ms precision. */
      on (event: 'response', listener: (client: unknown, statusCode: number, resBytes: number, responseTime: number) => void): Instance
    }
  }

  function autocannon (
    options: autocannon.Options, callback: (err: Error | null, result: autocannon.Result) => void
  ): autocannon.Instance

  export default autocannon
}
