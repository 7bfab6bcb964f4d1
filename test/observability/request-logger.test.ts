/**
 * The request's logger costs nothing until a line is written, and every line
 * that is written carries reqId and traceId; the access line is pino's format
 * with a fixed set of fields.
 */
import { IncomingMessage } from 'node:http'
import { Socket } from 'node:net'
import { Writable } from 'node:stream'
import type { FastifyBaseLogger, FastifyInstance } from 'fastify'
import pino from 'pino'
import t from 'tap'
import { refusedPort, startStubUpstream } from '../../fixtures/stub-upstream.js'
import { requestLoggerFactory } from '../../src/observability/request-logger.js'
import { bearer, build } from '../helpers/app.js'

const TRACE_ID = '0af7651916cd43dd8448eb211c80319c'
const TRACEPARENT = `00-${TRACE_ID}-b7ad6b7169203331-01`

function capture (): { stream: Writable; lines: () => Array<Record<string, unknown>>; text: () => string } {
  const chunks: string[] = []
  const stream = new Writable({
    write (chunk, _enc, cb) {
      chunks.push(String(chunk))
      cb()
    }
  })
  const text = (): string => chunks.join('')
  return {
    stream,
    text,
    lines: () =>
      text()
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as Record<string, unknown>)
  }
}

/** Counts pino child loggers made from the app's logger from now on. */
function countChildren (app: FastifyInstance): () => number {
  const log = app.log as FastifyBaseLogger & { child: FastifyBaseLogger['child'] }
  const child = log.child.bind(log)
  let made = 0
  log.child = ((...args: Parameters<FastifyBaseLogger['child']>) => {
    made++
    return child(...args)
  }) as FastifyBaseLogger['child']
  return () => made
}

t.test(
  'at warn: no child logger for requests that log nothing; an error line still has reqId and traceId',
  async (t) => {
    const stub = await startStubUpstream()
    t.teardown(stub.close)
    const log = capture()
    const { app } = await build(t, { upstreamUrl: stub.url, logger: { level: 'warn', stream: log.stream } })
    const children = countChildren(app)
    for (let i = 0; i < 3; i++) {
      const res = await app.inject({ url: '/api/portfolio/ping', headers: bearer() })
      t.equal(res.statusCode, 200)
    }
    t.equal(children(), 0, 'no child logger made')
    t.same(log.lines(), [], 'nothing written')

    const port = await refusedPort()
    const failing = await build(t, {
      upstreamUrl: `http://127.0.0.1:${port}`,
      logger: { level: 'warn', stream: log.stream }
    })
    const res = await failing.app.inject({
      url: '/api/portfolio/ping',
      headers: { ...bearer(), 'x-request-id': 'r-err', traceparent: TRACEPARENT }
    })
    t.equal(res.statusCode, 502)
    t.match(log.lines(), [
      {
        level: 50,
        reqId: 'r-err',
        traceId: TRACE_ID,
        code: 'UPSTREAM_UNAVAILABLE',
        msg: 'portfolio engine unavailable'
      }
    ])
  }
)

t.test("at info: the access line is pino's format, bindings first, with no child logger", async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const log = capture()
  const { app } = await build(t, { upstreamUrl: stub.url, logger: { level: 'info', stream: log.stream } })
  const children = countChildren(app)
  const res = await app.inject({
    url: '/api/portfolio/ping?x="quoted"',
    headers: { ...bearer(), 'x-request-id': 'r-"1"', traceparent: TRACEPARENT }
  })
  t.equal(res.statusCode, 200)
  t.equal(children(), 0, 'no child logger made')
  const [line] = log.lines().filter((l) => l.msg === 'request')
  t.same(
    Object.keys(line ?? {}),
    ['level', 'time', 'pid', 'hostname', 'reqId', 'traceId', 'method', 'url', 'ip', 'status', 'ms', 'msg'],
    "the fields in pino's order"
  )
  t.match(line, {
    level: 30,
    time: Number,
    pid: process.pid,
    reqId: 'r-"1"',
    traceId: TRACE_ID,
    method: 'GET',
    url: '/api/portfolio/ping?x=%22quoted%22',
    ip: '127.0.0.1',
    status: 200,
    ms: Number,
    msg: 'request'
  })
  t.ok(Math.abs(Number(line?.time) - Date.now()) < 60_000, 'time is now, in ms')
})

t.test(
  'the request logger: every kind of call carries reqId and traceId; below the level nothing is built',
  async (t) => {
    const log = capture()
    const parent = pino({ level: 'info' }, log.stream)
    const raw = { headers: { traceparent: TRACEPARENT } } as unknown as IncomingMessage
    let made = 0
    // Counts children of the parent and of its children (pino's child inherits this property).
    const child = parent.child
    parent.child = function (this: typeof parent, ...args: Parameters<typeof parent.child>) {
      made++
      return child.apply(this, args)
    } as typeof parent.child
    const logger = requestLoggerFactory.call(undefined as never, parent, { reqId: 'r-1' }, {}, raw as never)

    logger.debug({ skipped: true }, 'below the level')
    logger.trace('below the level')
    t.equal(made, 0, 'nothing built below the level')
    logger.info('a message alone')
    logger.warn({ code: 'X' }, 'fields and a message')
    t.equal(made, 0, 'lines of fields need no child')
    logger.error(new Error('boom'))
    t.equal(made, 1, 'an Error makes the real child')
    // (pino's child inherits the counting wrapper: its own child() counts too.)
    logger.child({ part: 'engine' }).info('from a child')
    t.equal(made, 2, "child() is the real child's, which is not made again")
    logger.info('after the child')
    t.equal(made, 2)
    t.match(log.lines(), [
      { level: 30, reqId: 'r-1', traceId: TRACE_ID, msg: 'a message alone' },
      { level: 40, reqId: 'r-1', traceId: TRACE_ID, code: 'X', msg: 'fields and a message' },
      { level: 50, reqId: 'r-1', traceId: TRACE_ID, err: { message: 'boom', type: 'Error' }, msg: 'boom' },
      { level: 30, reqId: 'r-1', traceId: TRACE_ID, part: 'engine', msg: 'from a child' },
      { level: 30, reqId: 'r-1', traceId: TRACE_ID, msg: 'after the child' }
    ])
    t.equal(logger.level, 'info')
    t.equal(log.lines().length, 5, 'nothing else written')
  }
)

t.test(
  "the request logger: an object that is not plain fields goes through pino as a child would take it; pino's level and binding methods work",
  async (t) => {
    const redact = {
      paths: ['req.headers.authorization', 'headers.authorization', 'req.headers.cookie'],
      censor: '[redacted]'
    }
    const lazy = capture()
    const real = capture()
    const raw = { headers: { traceparent: TRACEPARENT } } as unknown as IncomingMessage
    const lazyParent = pino({ level: 'info', redact, serializers: { req: pino.stdSerializers.req } }, lazy.stream)
    const realParent = pino({ level: 'info', redact, serializers: { req: pino.stdSerializers.req } }, real.stream)
    const logger = requestLoggerFactory.call(
      undefined as never,
      lazyParent,
      { reqId: 'r-2' },
      {},
      raw as never
    ) as FastifyBaseLogger & {
      isLevelEnabled: (l: string) => boolean
      bindings: () => Record<string, unknown>
      levelVal: number
      flush: () => void
    }
    const child = realParent.child({ reqId: 'r-2', traceId: TRACE_ID })
    // A request as pino knows one (method, url, headers, socket): its serializer keeps method, url and the
    // headers, which redaction censors; a spread would have written rawHeaders with the token.
    const message = new IncomingMessage(new Socket())
    Object.assign(message, {
      method: 'GET',
      url: '/x',
      headers: { authorization: 'Bearer SECRET-TOKEN' },
      rawHeaders: ['authorization', 'Bearer SECRET-TOKEN']
    })
    const shaped = { method: 'GET', url: '/y', headers: { authorization: 'Bearer SECRET-TOKEN' }, socket: {} }
    for (const request of [message, shaped]) {
      logger.info(request, 'a request')
      child.info(request, 'a request')
    }
    const strip = (l: Record<string, unknown>): Record<string, unknown> => ({ ...l, time: 0 })
    t.same(lazy.lines().map(strip), real.lines().map(strip), 'the same lines as a pino child writes')
    t.equal(lazy.lines().length, 2)
    t.notMatch(lazy.text(), /SECRET-TOKEN/, 'no token in the lines')

    t.equal(logger.isLevelEnabled('info'), true)
    t.equal(logger.isLevelEnabled('debug'), false)
    t.equal(logger.levelVal, 30)
    t.match(logger.bindings(), { reqId: 'r-2', traceId: TRACE_ID })
    t.doesNotThrow(() => {
      logger.flush()
    })
  }
)
