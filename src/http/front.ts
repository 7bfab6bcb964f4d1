/**
 * The HTTP server in front of Fastify (its `serverFactory`): the answers Node would give by itself, in the
 * gateway's shape and with an id (docs/decisions/0021-every-answer-has-a-shape-and-an-id.md),
 * `Expect: 100-continue` answered only once the request will proceed, the load shedder's 503, and the
 * pipelining and idle-timeout gaps Node leaves. Parser errors are client-error.ts.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import type { FastifyReply, FastifyRequest, HookHandlerDoneFunction } from 'fastify'
import { REQUEST_ID_HEADER } from '../../schemas/upstream.js'
import { cutByServer } from './client-gone.js'
import { bodyLimitOf, endsConnection, lingerOf, markBodyStart, type Lingers } from './connection-close.js'
import { requestIdFrom } from './request-id.js'
import { routerPath } from './router-path.js'
import { SERVER_LIMITS } from './limits.js'

type RequestListener = (req: IncomingMessage, res: ServerResponse) => void

/** An answer decided in front of Fastify, written by answerInFront. */
export interface FrontAnswer {
  status: number
  /** JSON text, serialised once by whoever decided it. */
  body: string
  headers?: Record<string, string>
}

export interface FrontOptions {
  /** The load shedder's verdict on a new request: an answer refuses it, undefined lets it through. */
  shed: (req: IncomingMessage) => FrontAnswer | undefined
  lifecycle: { readonly draining: boolean }
  linger: Lingers
}

const kAwaitingContinue = Symbol('gateway.awaitingContinue')
type ContinuableRequest = IncomingMessage & { [kAwaitingContinue]?: boolean }

const kWaiting = Symbol('gateway.waitingResponses')
type PipeliningSocket = Socket & { [kWaiting]?: ServerResponse[] }
type NodeSocket = Socket & { _httpMessage?: ServerResponse | null }

/** Attached to its socket (Node closes it then), or closed, or its answer sent whole: nothing to do for it. */
const settled = (res: ServerResponse): boolean => res.socket !== null || res.destroyed || res.writableFinished

/**
 * A pipelined response waits unattached while an earlier one owns the socket, and Node emits 'close' only on
 * the attached one: the waiting ones are closed here (closeWaitingResponses), so their access line, client-gone
 * signal and in-flight count do not wait forever. Answers go out in order: the list is pruned from its front.
 */
function awaitSocket (socket: PipeliningSocket, res: ServerResponse): void {
  let waiting = socket[kWaiting]
  if (waiting === undefined) {
    waiting = socket[kWaiting] = []
    socket.on('close', closeWaitingResponses)
  } else {
    while (waiting.length > 0 && settled(waiting[0]!)) waiting.shift()
  }
  waiting.push(res)
}

/** A request attached at once on a socket that pipelined before: those before it are all answered, let them go. */
function drained (socket: PipeliningSocket): void {
  socket[kWaiting]!.length = 0
}

/** The last response still owed on `socket`: a pipelined one waiting its turn, else the one attached. */
export function lastOwedResponse (socket: Socket): ServerResponse | undefined {
  const waiting = (socket as PipeliningSocket)[kWaiting]?.filter((res) => !settled(res)) ?? []
  return waiting.at(-1) ?? (socket as NodeSocket)._httpMessage ?? undefined
}

function closeWaitingResponses (this: PipeliningSocket): void {
  const waiting = this[kWaiting] ?? []
  this[kWaiting] = undefined
  for (const res of waiting) {
    if (settled(res)) continue
    // What Node's emitCloseNT does for an attached response.
    const closing = res as ServerResponse & { destroyed: boolean, _closed?: boolean }
    closing.destroyed = true
    closing._closed = true
    res.emit('close')
  }
}

/**
 * The idle timeout (`server.setTimeout`) destroys the socket, as Node would, first marking a request still
 * waiting for its answer as cut off by the server: its line says 408, as nginx logs it, not a client that left.
 */
function cutOnIdle (socket: NodeSocket & PipeliningSocket): void {
  const res = socket._httpMessage
  // An answer already under way (a client that stopped reading) keeps its status, as nginx logs it.
  if (res != null && !res.writableFinished) cutByServer(res, res.headersSent ? res.statusCode : 408)
  for (const waiting of socket[kWaiting] ?? []) if (!settled(waiting)) cutByServer(waiting, 408)
  socket.destroy()
}

/** An answer written in front of Fastify: a JSON body, an id, and the connection ended as every answer's is. */
export function answerInFront (
  req: IncomingMessage,
  res: ServerResponse,
  status: number,
  body: string,
  ends: Pick<FrontOptions, 'lifecycle' | 'linger'>,
  headers: Record<string, string> = {}
): void {
  const requestId = requestIdFrom(req)
  const limit = bodyLimitOf(routerPath(req.url ?? ''))
  res.writeHead(status, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(body),
    ...headers,
    [REQUEST_ID_HEADER]: requestId,
    ...(endsConnection(req, ends.lifecycle, limit, ends.linger, requestId) ? { connection: 'close' } : {})
  })
  res.end(body)
}

export function createFrontServer (fastify: RequestListener, { shed, lifecycle, linger }: FrontOptions): Server {
  const simpleAnswer = (req: IncomingMessage, res: ServerResponse, status: number, message: string): void => {
    answerInFront(req, res, status, JSON.stringify({ error: message }), { lifecycle, linger })
  }

  const front: RequestListener = (req, res) => {
    markBodyStart(req)
    if (lingerOf(req.socket) !== undefined) {
      req.socket.destroy()
      return
    }
    if (req.httpVersionMinor === 1 && req.httpVersionMajor === 1 && req.headers.host === undefined) {
      simpleAnswer(req, res, 400, 'missing Host header')
      return
    }
    const refusal = shed(req)
    if (refusal === undefined) {
      if (res.socket === null) awaitSocket(req.socket, res)
      else if ((req.socket as PipeliningSocket)[kWaiting] !== undefined) drained(req.socket)
      fastify(req, res)
    } else answerInFront(req, res, refusal.status, refusal.body, { lifecycle, linger }, refusal.headers)
  }

  const server = createServer({
    // Answered above, in the simple shape.
    requireHostHeader: false,
    // Node checks headersTimeout and requestTimeout this often (its default, 30 s, would make 10 s mean up to 40 s).
    connectionsCheckingInterval: SERVER_LIMITS.connectionsCheckingIntervalMs
    // maxRequestsPerSocket stays unset: past it Node answers a bare 503 of its own, without our shape or an id.
  }, front)
  server.on('timeout', cutOnIdle)
  server.on('checkContinue', (req: ContinuableRequest, res: ServerResponse) => {
    req[kAwaitingContinue] = true
    front(req, res)
  })
  server.on('checkExpectation', (req: IncomingMessage, res: ServerResponse) => {
    markBodyStart(req)
    simpleAnswer(req, res, 417, 'unsupported Expect header: only 100-continue is accepted')
  })
  return server
}

/** A client waits on `Expect: 100-continue` and has not been invited yet. */
export function awaitingContinue (raw: IncomingMessage): boolean {
  return (raw as ContinuableRequest)[kAwaitingContinue] === true
}

/** Invite the body of a client waiting on `Expect: 100-continue`: the request will proceed. Once. */
export function writeContinue (raw: IncomingMessage, res: ServerResponse): void {
  const request = raw as ContinuableRequest
  if (request[kAwaitingContinue] !== true || res.headersSent) return
  request[kAwaitingContinue] = false
  res.writeContinue()
}

/** An onRequest hook placed after auth, the rate limit and shedding: it invites the body of a waiting client. */
export function inviteBody (request: FastifyRequest, reply: FastifyReply, done: HookHandlerDoneFunction): void {
  writeContinue(request.raw, reply.raw)
  done()
}
