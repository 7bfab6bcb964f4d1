/**
 * The floor any Node gateway pays (DECISIONS 30): the smallest honest proxy
 * in front of the same mock engine. `node:http`, an HS256 check with a
 * verified-token cache, an undici `Pool`, the answer copied back. Nothing
 * else: no logging, no ids, no validation, no limits, no routing beyond the
 * path. Every scenario's CPU per request is reported as a ratio to it.
 *
 * "Honest" means it does what a proxy in front of this engine must do, once:
 * it refuses a missing, malformed, forged or expired token (401), tells the
 * engine who the caller is (x-user-id), streams a body on, and gives the
 * engine's status, content type and bytes back (502 when the engine cannot be
 * reached or fails mid-answer). It calls the engine the way the gateway does,
 * with undici's dispatch and a plain handler object: no client work the
 * gateway does not do either.
 *
 * Process: `node dist/bench/bare-proxy.js --port N --upstream URL --secret=S [--fastify]`
 * (`--secret=S` joined: a base64url secret may begin with a dash)
 * prints `listening <url>` once it accepts connections (`--fastify`: the same on Fastify).
 */
import { createHmac, timingSafeEqual } from 'node:crypto'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import type { FastifyReply, FastifyRequest } from 'fastify'
import { Pool, type Dispatcher } from 'undici'

interface Verified {
  sub: string
  /** ms since the epoch after which the token is refused. */
  expiresAt: number
}

/** Bounded: dropped whole when full, which a benchmark with a handful of tokens never reaches. */
const CACHE_MAX = 10_000

export function createVerifier (secret: string): (authorization: string | undefined) => string | undefined {
  const cache = new Map<string, Verified>()
  const key = Buffer.from(secret)
  return (authorization) => {
    if (authorization === undefined || !authorization.startsWith('Bearer ')) return undefined
    const token = authorization.slice(7)
    const hit = cache.get(token)
    if (hit !== undefined) {
      if (hit.expiresAt > Date.now()) return hit.sub
      cache.delete(token)
      return undefined
    }
    const [head, payload, signature] = token.split('.')
    if (head === undefined || payload === undefined || signature === undefined) return undefined
    const expected = createHmac('sha256', key).update(`${head}.${payload}`).digest()
    const given = Buffer.from(signature, 'base64url')
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) return undefined
    try {
      const header = JSON.parse(Buffer.from(head, 'base64url').toString('utf8')) as { alg?: unknown }
      const claims = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8')) as { sub?: unknown; exp?: unknown }
      if (header.alg !== 'HS256' || typeof claims.sub !== 'string' || typeof claims.exp !== 'number') return undefined
      const expiresAt = claims.exp * 1000
      if (expiresAt <= Date.now()) return undefined
      if (cache.size >= CACHE_MAX) cache.clear()
      cache.set(token, { sub: claims.sub, expiresAt })
      return claims.sub
    } catch {
      return undefined
    }
  }
}

const UNAUTHORIZED = Buffer.from('{"error":"unauthorized"}')
const BAD_GATEWAY = Buffer.from('{"error":"bad gateway"}')
const JSON_TYPE = 'application/json'

type Controller = Parameters<NonNullable<Dispatcher.DispatchHandler['onRequestStart']>>[0]
/** Writes an answer to the client: `node:http`'s response or Fastify's reply. */
type Deliver<T> = (to: T, status: number, type: string, body: Buffer) => void

/**
 * The engine's answer collected and copied back, through undici's plain
 * dispatch handler: what the gateway's engine client does
 * (src/engine-client/attempt.ts), so the floor does no client work the
 * gateway is spared. `pool.request()` would add a promise, a BodyReadable
 * stream and its arrayBuffer() per request (12-36% of the bare proxy's CPU
 * per request in a review's measurement). An error before the whole answer is
 * in becomes 502: nothing has been written to the client until then.
 */
class Collect<T> implements Dispatcher.DispatchHandler {
  status = 0
  type = 'application/octet-stream'
  chunks: Buffer[] = []
  size = 0
  constructor (
    readonly to: T,
    readonly deliver: Deliver<T>
  ) {}

  // undici 7 tells this handler API from the legacy one by this method (handler/unwrap-handler.js).
  onRequestStart (): void {}

  onResponseStart (_c: Controller, statusCode: number, headers: Record<string, string | string[] | undefined>): void {
    this.status = statusCode
    const type = headers['content-type']
    if (typeof type === 'string') this.type = type
  }

  onResponseData (_c: Controller, chunk: Buffer): void {
    this.chunks.push(chunk)
    this.size += chunk.length
  }

  onResponseEnd (): void {
    this.deliver(
      this.to,
      this.status,
      this.type,
      this.chunks.length === 1 ? this.chunks[0]! : Buffer.concat(this.chunks, this.size)
    )
  }

  onResponseError (): void {
    this.deliver(this.to, 502, JSON_TYPE, BAD_GATEWAY)
  }
}

/** The engine request's headers: who the caller is, and the body's type and length as the client sent them. */
function engineHeaders (sub: string, incoming: http.IncomingHttpHeaders): Record<string, string> {
  const headers: Record<string, string> = { 'x-user-id': sub }
  const type = incoming['content-type']
  if (type !== undefined) headers['content-type'] = type
  const length = incoming['content-length']
  if (length !== undefined) headers['content-length'] = length
  return headers
}

const newPool = (upstream: string): Pool =>
  new Pool(upstream, { connections: 128, pipelining: 1, keepAliveTimeout: 4_000 })

const writeAnswer: Deliver<http.ServerResponse> = (res, status, type, body) => {
  res.writeHead(status, { 'content-type': type, 'content-length': body.length })
  res.end(body)
}

export function createBareProxy (upstream: string, secret: string): http.Server {
  const verify = createVerifier(secret)
  const pool = newPool(upstream)
  return http.createServer((req, res) => {
    const sub = verify(req.headers.authorization)
    if (sub === undefined) {
      writeAnswer(res, 401, JSON_TYPE, UNAUTHORIZED)
      req.resume()
      return
    }
    const hasBody = req.method !== 'GET' && req.method !== 'HEAD'
    pool.dispatch(
      {
        method: req.method as 'GET',
        path: req.url ?? '/',
        headers: engineHeaders(sub, req.headers),
        body: hasBody ? req : null
      },
      new Collect(res, writeAnswer)
    )
  })
}

const sendReply: Deliver<FastifyReply> = (reply, status, type, body) => {
  void reply.code(status).type(type).send(body)
}

/**
 * The same proxy on Fastify, for the routes the bench measures (ping and
 * update; any other path is Fastify's 404): one onRequest hook for the token,
 * one route per call, the body passed on as the stream it is. What any gateway built on
 * Fastify pays before it does anything of its own; beside the bare proxy it
 * shows the framework's share of the gateway's cost.
 */
export async function createBareFastify (upstream: string, secret: string): Promise<http.Server> {
  const { default: Fastify } = await import('fastify')
  const verify = createVerifier(secret)
  const pool = newPool(upstream)
  const app = Fastify({ logger: false })
  app.removeAllContentTypeParsers()
  app.addContentTypeParser('*', (_req, payload, done) => {
    done(null, payload)
  })
  app.decorateRequest('sub', '')
  app.addHook('onRequest', (req, reply, done) => {
    const sub = verify(req.headers.authorization)
    if (sub === undefined) {
      sendReply(reply, 401, JSON_TYPE, UNAUTHORIZED)
      return
    }
    ;(req as unknown as { sub: string }).sub = sub
    done()
  })
  // Not async and returning nothing: Fastify then waits for the reply the handler's deliver sends.
  const forward = (req: FastifyRequest, reply: FastifyReply): void => {
    const headers = engineHeaders((req as unknown as { sub: string }).sub, req.headers)
    pool.dispatch(
      { method: req.method as 'GET', path: req.url, headers, body: req.method === 'GET' ? null : req.raw },
      new Collect(reply, sendReply)
    )
  }
  app.get('/api/portfolio/ping', forward)
  app.post('/api/portfolio/update', forward)
  await app.ready()
  return app.server
}

async function main (): Promise<void> {
  const { values } = parseArgs({
    options: {
      port: { type: 'string', default: '0' },
      host: { type: 'string', default: '127.0.0.1' },
      upstream: { type: 'string' },
      secret: { type: 'string' },
      fastify: { type: 'boolean', default: false }
    }
  })
  if (values.upstream === undefined || values.secret === undefined) { throw new Error('usage: bare-proxy --upstream URL --secret S [--port N] [--host H] [--fastify]') }
  const server = values.fastify
    ? await createBareFastify(values.upstream, values.secret)
    : createBareProxy(values.upstream, values.secret)
  server.keepAliveTimeout = 65_000
  await new Promise<void>((resolve) => server.listen(Number(values.port), values.host, resolve))
  const { port } = server.address() as AddressInfo
  process.stdout.write(`listening http://${values.host}:${port}\n`)
  // Exit on SIGTERM at once (a --cpu-prof run then writes its profile).
  process.once('SIGTERM', () => process.exit(0))
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((err: unknown) => {
    process.stderr.write(`bare-proxy: ${err instanceof Error ? err.message : String(err)}\n`)
    process.exit(1)
  })
}
