/**
 * W3C Trace Context (https://www.w3.org/TR/trace-context/): a valid client `traceparent` keeps its trace id, anything
 * else starts a new trace; the engine and every log line get the same id, so one request can be followed across both
 * services. The trace is made when first asked for, never for a request that neither calls the engine nor logs.
 */
import { BlockList, isIP, type Socket } from 'node:net'
import type { IncomingMessage } from 'node:http'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import { randomHex } from '../shared/random-hex.js'

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

/** version-traceid-parentid-flags, lowercase hex only (spec §3.2.2): 55 characters. */
const VERSION_00 = /^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/
/** A later version: the same first four fields, then nothing or a dash and more (spec §3.2.4); ff is invalid. */
const LATER_VERSION = /^(?!ff)[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(?:-.*)?$/
const ALL_ZERO_TRACE = '0'.repeat(32)
const ALL_ZERO_PARENT = '0'.repeat(16)

/** Parse a client's header strictly; undefined for anything the spec says to ignore. */
export function parseTraceParent (header: string | string[] | undefined): TraceParent | undefined {
  // Repeated headers are invalid (spec §3.2); Node joins them with ", ", which a later version's tail would accept.
  if (typeof header !== 'string' || header.length > 512 || header.includes(',')) return undefined
  const valid = header.startsWith('00') ? header.length === 55 && VERSION_00.test(header) : LATER_VERSION.test(header)
  if (!valid) return undefined
  const traceId = header.slice(3, 35)
  const parentId = header.slice(36, 52)
  if (traceId === ALL_ZERO_TRACE || parentId === ALL_ZERO_PARENT) return undefined
  return { traceId, parentId, flags: header.slice(53, 55) }
}

/** A random id of `bytes` bytes that is not all zeros (`zero`, the spec's invalid value). */
function nonZeroId (bytes: number, zero: string): string {
  let id = randomHex(bytes)
  while (id === zero) id = randomHex(bytes)
  return id
}

export const newTraceId = (): string => nonZeroId(16, ALL_ZERO_TRACE)
export const newSpanId = (): string => nonZeroId(8, ALL_ZERO_PARENT)

/** Version 00, the one this gateway speaks. */
export function formatTraceParent (traceId: string, spanId: string, flags: string): string {
  return `00-${traceId}-${spanId}-${flags}`
}

interface Trace {
  traceId: string
  traceparent: string | undefined
  /** Undefined for a trace the gateway started. */
  client: TraceParent | undefined
}

const kTrace = Symbol('trace')
type TracedRequest = IncomingMessage & { [kTrace]?: Trace }

function newTrace (raw: IncomingMessage): Trace {
  const given = parseTraceParent(raw.headers[TRACEPARENT_HEADER])
  return { traceId: given?.traceId ?? newTraceId(), traceparent: undefined, client: given }
}

/** Kept on the raw request, made by whoever asks first. */
function traceOf (raw: IncomingMessage): Trace {
  return ((raw as TracedRequest)[kTrace] ??= newTrace(raw))
}

/** Replace the `traceparent` the engine gets, keeping the request's trace. */
export function setTraceparent (raw: IncomingMessage, traceparent: string): void {
  traceOf(raw).traceparent = traceparent
}

export function clientTraceParent (raw: IncomingMessage): TraceParent | undefined {
  return traceOf(raw).client
}

export function traceIdOf (raw: IncomingMessage): string {
  return traceOf(raw).traceId
}

/**
 * `request.traceparent` for the engine call, with the gateway's own span id. The sampled flag is the client's only
 * from a trusted proxy: the engine follows it, so anyone else could have every request recorded there.
 */
export function installTraceContext (app: FastifyInstance, trustProxy: readonly string[] | undefined): void {
  const trusted = trustedPeers(trustProxy)
  app.decorateRequest('traceparent', {
    getter (this: FastifyRequest): string {
      const trace = traceOf(this.raw)
      if (trace.traceparent !== undefined) return trace.traceparent
      const client = trace.client
      const sampled =
        client !== undefined && (parseInt(client.flags, 16) & 0x01) === 1 && trusted(this.raw.socket.remoteAddress)
      return (trace.traceparent = formatTraceParent(trace.traceId, newSpanId(), sampled ? '01' : '00'))
    }
  })
}

/** Whether a peer address is one of `entries` (addresses or CIDRs); IPv4-mapped IPv6 peers match IPv4 entries. */
export function trustedPeers (entries: readonly string[] | undefined): (address: string | undefined) => boolean {
  if (entries === undefined || entries.length === 0) return () => false
  const list = new BlockList()
  for (const entry of entries) {
    const [address = '', bits] = entry.split('/')
    const type = isIP(address) === 6 ? 'ipv6' : 'ipv4'
    list.addSubnet(address, bits === undefined ? (type === 'ipv6' ? 128 : 32) : Number(bits), type)
  }
  return (address) =>
    address !== undefined && isIP(address) !== 0 && list.check(address, isIP(address) === 6 ? 'ipv6' : 'ipv4')
}

/** The client behind a socket as Fastify's `request.ip` says it, for answers given in front of Fastify. */
export function clientAddressOf (
  trustProxy: readonly string[] | undefined
): (socket: Socket, raw: IncomingMessage | undefined) => string {
  const trusted = trustedPeers(trustProxy)
  return (socket, raw) => {
    const peer = socket.remoteAddress ?? ''
    if (!trusted(peer)) return peer
    const forwarded = raw?.headers['x-forwarded-for']
    const hops = (Array.isArray(forwarded) ? forwarded.join(',') : (forwarded ?? ''))
      .split(',')
      .map((hop) => hop.trim())
    for (let i = hops.length - 1; i >= 0; i--) if (hops[i] !== '' && !trusted(hops[i])) return hops[i]!
    return peer
  }
}
