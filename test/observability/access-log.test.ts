/**
 * The access line is one JSON object per request, whatever the request left
 * behind: a client that reset its connection before the answer ended has no
 * address by the time the line is written (request.ip is undefined).
 */
import { IncomingMessage } from 'node:http'
import { Socket } from 'node:net'
import { Writable } from 'node:stream'
import pino from 'pino'
import t from 'tap'
import type { FastifyReply, FastifyRequest } from 'fastify'
import { accessLog } from '../../src/observability/access-log.js'

function capture (): { logger: pino.Logger, lines: () => string[] } {
  let out = ''
  const stream = new Writable({ write (chunk: Buffer, _enc, cb) { out += chunk.toString(); cb() } })
  const logger = pino({ level: 'info' }, stream)
  // accessLog writes to pino's own destination (the stream above) through its symbol.
  return { logger, lines: () => out.split('\n').filter((l) => l !== '') }
}

t.test('a request whose client is gone (no address) still gives a JSON line, with ip null', async (t) => {
  const { logger, lines } = capture()
  const write = accessLog(logger)
  const raw = new IncomingMessage(new Socket())
  const request = { id: 'req-1', method: 'GET', url: '/health?a="q"&b=\\x', ip: undefined, raw } as unknown as FastifyRequest
  write(request, { statusCode: 200, elapsedTime: 3.4 } as unknown as FastifyReply)
  write({ ...request, id: 'req-2', ip: '127.0.0.1' } as unknown as FastifyRequest, { statusCode: 401, elapsedTime: 1 } as unknown as FastifyReply)
  const parsed = lines().map((l) => JSON.parse(l) as Record<string, unknown>)
  t.equal(parsed.length, 2)
  t.match(parsed[0], { level: 30, reqId: 'req-1', method: 'GET', url: '/health?a="q"&b=\\x', ip: null, status: 200, ms: 3, msg: 'request' })
  t.match(parsed[1], { reqId: 'req-2', ip: '127.0.0.1', status: 401, ms: 1 })
  t.match(parsed[0]!['traceId'], /^[0-9a-f]{32}$/)
})
