/**
 * `GET /metrics` and `GET /status` on a port of their own, so the public port never exposes them and a scrape never
 * waits behind client traffic limits (decision: metrics).
 */
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { GatewayMetrics } from './metrics.js'
import type { GatewayStatus } from './status.js'

export interface MetricsServer {
  port: number
  close: () => Promise<void>
}

/** The port is taken: the message is the one line start-up prints. */
export class MetricsPortError extends Error {
  override name = 'MetricsPortError'
}

export interface MetricsServerOptions {
  port: number
  host: string
  /** Read for each GET /status; without it, 404. */
  status?: () => GatewayStatus
}

const JSON_TYPE = 'application/json; charset=utf-8'

export async function startMetricsServer (metrics: GatewayMetrics, opts: MetricsServerOptions): Promise<MetricsServer> {
  const server: Server = createServer((req, res) => {
    const path = req.url?.split('?')[0]
    if (req.method === 'GET' && path === '/status' && opts.status !== undefined) {
      let body
      try {
        body = JSON.stringify(opts.status())
      } catch {
        res.writeHead(500, { 'content-type': JSON_TYPE }).end('{"error":"status collection failed"}')
        return
      }
      res.writeHead(200, { 'content-type': JSON_TYPE, 'cache-control': 'no-store' }).end(body)
      return
    }
    if (req.method !== 'GET' || path !== '/metrics') {
      res.writeHead(404, { 'content-type': JSON_TYPE }).end(opts.status === undefined
        ? '{"error":"not found: metrics are at GET /metrics"}'
        : '{"error":"not found: metrics are at GET /metrics, status at GET /status"}')
      return
    }
    metrics.scrape().then(({ contentType, body }) => {
      res.writeHead(200, { 'content-type': contentType }).end(body)
    }, () => {
      res.writeHead(500, { 'content-type': JSON_TYPE }).end('{"error":"metrics collection failed"}')
    })
  })
  // A scraper keeps its connection; it must not hold shutdown.
  server.keepAliveTimeout = 5_000
  server.requestTimeout = 10_000
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err: NodeJS.ErrnoException) => {
      reject(err.code === 'EADDRINUSE'
        ? new MetricsPortError(`METRICS_PORT=${opts.port} is already in use on ${opts.host}: ` +
          'pick a free port, or set METRICS_PORT=0 to turn metrics off')
        : err)
    })
    server.listen(opts.port, opts.host, () => resolve())
  })
  return {
    port: (server.address() as AddressInfo).port,
    close: () => new Promise<void>((resolve) => {
      server.close(() => resolve())
      server.closeAllConnections()
    })
  }
}
