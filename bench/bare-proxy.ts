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
 * engine's status, content type and bytes back.
 *
 * Process: `node dist/bench/bare-proxy.js --port N --upstream URL --secret S [--fastify]`
 * prints `listening <url>` once it accepts connections (`--fastify`: the same on Fastify).
 */
import { createHmac, timingSafeEqual } from 'node:crypto'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import { Pool } from 'undici'

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
      const claims = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8')) as { sub?: unknown, exp?: unknown }
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

export function createBareProxy (upstream: string, secret: string): http.Server {
  const verify = createVerifier(secret)
  const pool = new Pool(upstream, { connections: 128, pipelining: 1, keepAliveTimeout: 4_000 })
  return http.createServer((req, res) => {
    const sub = verify(req.headers.authorization)
    if (sub === undefined) {
      res.writeHead(401, { 'content-type': 'application/json', 'content-length': UNAUTHORIZED.length })
      res.end(UNAUTHORIZED)
      req.resume()
      return
    }
    const headers: Record<string, string> = { 'x-user-id': sub }
    const type = req.headers['content-type']
    if (type !== undefined) headers['content-type'] = type
    const length = req.headers['content-length']
    if (length !== undefined) headers['content-length'] = length
    const hasBody = req.method !== 'GET' && req.method !== 'HEAD'
    pool.request({ method: req.method as 'GET', path: req.url ?? '/', headers, body: hasBody ? req : null }).then(async (answer) => {
      const body = Buffer.from(await answer.body.arrayBuffer())
      const answerType = answer.headers['content-type']
      res.writeHead(answer.statusCode, { 'content-type': typeof answerType === 'string' ? answerType : 'application/octet-stream', 'content-length': body.length })
      res.end(body)
    }, () => {
      res.writeHead(502, { 'content-type': 'application/json', 'content-length': BAD_GATEWAY.length })
      res.end(BAD_GATEWAY)
    })
  })
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
  const pool = new Pool(upstream, { connections: 128, pipelining: 1, keepAliveTimeout: 4_000 })
  const app = Fastify({ logger: false })
  app.removeAllContentTypeParsers()
  app.addContentTypeParser('*', (_req, payload, done) => { done(null, payload) })
  app.decorateRequest('sub', '')
  app.addHook('onRequest', (req, reply, done) => {
    const sub = verify(req.headers.authorization)
    if (sub === undefined) {
      void reply.code(401).type('application/json').send(UNAUTHORIZED)
      return
    }
    (req as unknown as { sub: string }).sub = sub
    done()
  })
  const forward = async (req: import('fastify').FastifyRequest, reply: import('fastify').FastifyReply): Promise<Buffer> => {
    const headers: Record<string, string> = { 'x-user-id': (req as unknown as { sub: string }).sub }
    const type = req.headers['content-type']
    if (type !== undefined) headers['content-type'] = type
    const length = req.headers['content-length']
    if (length !== undefined) headers['content-length'] = length
    try {
      const answer = await pool.request({ method: req.method as 'GET', path: req.url, headers, body: req.method === 'GET' ? null : req.raw })
      const body = Buffer.from(await answer.body.arrayBuffer())
      const answerType = answer.headers['content-type']
      void reply.code(answer.statusCode).type(typeof answerType === 'string' ? answerType : 'application/octet-stream')
      return body
    } catch {
      void reply.code(502).type('application/json')
      return BAD_GATEWAY
    }
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
  if (values.upstream === undefined || values.secret === undefined) throw new Error('usage: bare-proxy --upstream URL --secret S [--port N] [--host H] [--fastify]')
  const server = values.fastify ? await createBareFastify(values.upstream, values.secret) : createBareProxy(values.upstream, values.secret)
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
