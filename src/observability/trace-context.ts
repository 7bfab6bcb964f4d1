/**
 * W3C Trace Context (https://www.w3.org/TR/trace-context/): the gateway is one
 * span of the client's trace. A valid `traceparent` from the client keeps its
 * trace id; anything else starts a new trace. The engine gets the same trace id
 * with the gateway's own span id as parent-id, and every log line of the
 * request carries `traceId` beside `reqId`, so one request can be followed
 * across both services.
 */
import { randomFillSync } from 'node:crypto'
import type { IncomingMessage } from 'node:http'
import type { FastifyInstance, FastifyRequest, FastifyServerOptions } from 'fastify'

export const TRACEPARENT_HEADER = 'traceparent'

declare module 'fastify' {
  interface FastifyRequest {
    /** The `traceparent` the engine gets: this request's trace id and the gateway's span id. */
    traceparent: string
  }
}

export interface TraceParent {
  traceId: string
  parentId: string
  flags: string
}

/** version-traceid-parentid-flags, lowercase hex only (spec §3.2.2). */
const VERSION_00 = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/
/**
 * A later version: the same first four fields, and after them nothing or a
 * dash and more (spec §3.2.4, "versioning of traceparent"); ff is invalid.
 */
const LATER_VERSION = /^(?!ff)[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-.*)?$/
const ALL_ZERO_TRACE = '0'.repeat(32)
const ALL_ZERO_PARENT = '0'.repeat(16)

/** Parse a client's header strictly; undefined for anything the spec says to ignore. */
export function parseTraceParent (header: string | string[] | undefined): TraceParent | undefined {
  // Several traceparent headers are invalid (spec §3.2: one header only).
  if (typeof header !== 'string' || header.length > 512) return undefined
  const match = VERSION_00.exec(header) ?? (header.startsWith('00') ? null : LATER_VERSION.exec(header))
  if (match === null) return undefined
  const [, traceId, parentId, flags] = match as unknown as [string, string, string, string]
  if (traceId === ALL_ZERO_TRACE || parentId === ALL_ZERO_PARENT) return undefined
  return { traceId, parentId, flags }
}

/**
 * Random hex ids from a pooled buffer: one randomFillSync per 512 bytes
 * instead of a crypto call per id on the request path.
 */
const pool = Buffer.alloc(512)
let offset = pool.length
function randomHex (bytes: number): string {
  if (offset + bytes > pool.length) {
    randomFillSync(pool)
    offset = 0
  }
  const hex = pool.toString('hex', offset, offset + bytes)
  offset += bytes
  return hex
}

/** A random id of `bytes` bytes that is not all zeros (the spec's invalid value). */
function nonZeroId (bytes: number): string {
  let id = randomHex(bytes)
  while (/^0+$/.test(id)) id = randomHex(bytes)
  return id
}

export const newTraceId = (): string => nonZeroId(16)
export const newSpanId = (): string => nonZeroId(8)

/** The header for the engine: version 00 (the one this gateway speaks), the trace id, the gateway's span as parent. */
export function formatTraceParent (traceId: string, spanId: string, flags: string): string {
  return `00-${traceId}-${spanId}-${flags}`
}

const kTraceparent = Symbol('traceparent')
type TracedRequest = IncomingMessage & { [kTraceparent]?: string }

/** The `traceparent` for the engine: the client's trace continued, or a new one. */
function traceOf (raw: IncomingMessage): { traceId: string, traceparent: string } {
  const given = parseTraceParent(raw.headers[TRACEPARENT_HEADER])
  const traceId = given?.traceId ?? newTraceId()
  // The client's sampled bit is kept; other bits are cleared (spec §3.2.2.5). A trace
  // the gateway starts is not sampled: it records no spans of its own.
  const flags = given === undefined ? '00' : ((parseInt(given.flags, 16) & 0x01) === 1 ? '01' : '00')
  return { traceId, traceparent: formatTraceParent(traceId, newSpanId(), flags) }
}

/**
 * Fastify's `childLoggerFactory`: the request's one child logger is made with
 * `traceId` beside `reqId`, instead of a second child in a hook (a pino child
 * per request is the costly part). The traceparent waits on the raw request.
 */
export const tracingChildLogger: NonNullable<FastifyServerOptions['childLoggerFactory']> = function (logger, bindings, opts, raw) {
  const { traceId, traceparent } = traceOf(raw)
  ;(raw as TracedRequest)[kTraceparent] = traceparent
  return logger.child({ ...bindings, traceId }, opts)
}

/** Every request has its trace: `request.traceparent` for the engine call. */
export function installTraceContext (app: FastifyInstance): void {
  app.decorateRequest('traceparent', {
    getter (this: FastifyRequest): string {
      const raw = this.raw as TracedRequest
      // Routes the logger factory never saw (none today) still get a trace.
      raw[kTraceparent] ??= traceOf(raw).traceparent
      return raw[kTraceparent]
    }
  })
}
