/**
 * The standalone engine's own Prometheus metrics, so an operator sees each engine, not only the gateways' view of it.
 * Served on a port of their own, as the gateway's (decision: metrics). Label values never come from the request, so
 * a caller cannot grow the series count.
 */
import { createServer, type Server } from 'node:http'
import { once } from 'node:events'
import type { FastifyInstance } from 'fastify'
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client'
import { SERVICE_CONNECTED } from '../../schemas/upstream.js'

/** Any other method is `other`, so no client adds series. */
const KNOWN_METHODS = new Set(['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS'])
import type { PortfolioStore } from './store.js'

/** The gateway's buckets. */
const LATENCY_BUCKETS_S = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]
const UNMATCHED_ROUTE = 'unmatched'
const SERVICES = ['database', 'cache'] as const

export interface EngineMetricsSubject {
  store: PortfolioStore
  /** The store's kind, never its URL: that may carry a password. */
  storeKind: 'memory' | 'redis'
  lifecycle: { readonly draining: boolean }
}

export class EngineMetrics {
  readonly registry = new Registry()

  readonly requests = new Counter({
    name: 'portfolio_engine_requests_total',
    help: 'Answered requests by route template, method and status class',
    labelNames: ['route', 'method', 'status_class'] as const,
    registers: [this.registry]
  })

  readonly requestDuration = new Histogram({
    name: 'portfolio_engine_request_duration_seconds',
    help: 'Time from the request arriving to the answer being sent, by route template, method and status class',
    labelNames: ['route', 'method', 'status_class'] as const,
    buckets: LATENCY_BUCKETS_S,
    registers: [this.registry]
  })

  constructor () {
    collectDefaultMetrics({ register: this.registry, prefix: 'portfolio_engine_' })
  }

  /** Counts every answer of `app` and watches its store and drain state; called before any route is added. */
  instrument (app: FastifyInstance, { store, storeKind, lifecycle }: EngineMetricsSubject): void {
    // Asked at each scrape, as GET /health asks it: a Redis PING, never a remembered value.
    new Gauge({
      name: 'portfolio_engine_store_up',
      help: "Whether the engine's store reports each service connected " +
        '(1) or not (0), by service and store kind (memory, redis)',
      labelNames: ['service', 'store'] as const,
      registers: [this.registry],
      async collect () {
        const state = await store.state()
        for (const service of SERVICES) {
          this.set({ service, store: storeKind }, state[service] === SERVICE_CONNECTED ? 1 : 0)
        }
      }
    })
    new Gauge({
      name: 'portfolio_engine_draining',
      help: 'Whether the engine is draining for shutdown (1: /health ' +
        'answers 500 and every answer closes its connection)',
      registers: [this.registry],
      collect () {
        this.set(lifecycle.draining ? 1 : 0)
      }
    })
    app.addHook('onResponse', (request, reply, done) => {
      const route = request.is404 ? UNMATCHED_ROUTE : (request.routeOptions.url ?? UNMATCHED_ROUTE)
      const labels = {
        route,
        method: KNOWN_METHODS.has(request.method) ? request.method : 'other',
        status_class: `${Math.floor(reply.statusCode / 100)}xx`
      }
      this.requests.inc(labels)
      this.requestDuration.observe(labels, reply.elapsedTime / 1000)
      done()
    })
  }

  /** GET /metrics on `host:port`; rejects when the port is taken, so the caller can name ENGINE_METRICS_PORT. */
  async listen (host: string, port: number): Promise<Server> {
    const server = createServer((req, res) => {
      if (req.method !== 'GET' || (req.url ?? '').split('?')[0] !== '/metrics') {
        res
          .writeHead(404, { 'content-type': 'application/json' })
          .end(JSON.stringify({ error: 'not found: the engine serves only GET /metrics here' }))
        return
      }
      this.registry.metrics().then(
        (body) => {
          res.writeHead(200, { 'content-type': this.registry.contentType }).end(body)
        },
        (err: Error) => {
          res
            .writeHead(500, { 'content-type': 'application/json' })
            .end(JSON.stringify({ error: `metrics unavailable: ${err.message}` }))
        }
      )
    })
    server.listen(port, host)
    await Promise.race([
      once(server, 'listening'),
      once(server, 'error').then(([err]) => {
        throw err
      })
    ])
    return server
  }
}
