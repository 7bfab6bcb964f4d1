/**
 * An OTLP/HTTP traces receiver (POST /v1/traces, protobuf), for the bench, the
 * tests and docs/trace.svg:
 * - as a process (`node dist/bench/otlp-sink.js [port]`) it accepts and
 *   discards, and prints `otlp sink listening on <port>`: the collector of the
 *   traced bench scenarios, costing the gateway what a healthy collector does;
 * - imported, `startOtlpSink` keeps what it decodes (tests), or hangs or
 *   refuses (a sick collector).
 *
 * The decoder is written here from the OTLP protobuf schema
 * (opentelemetry/proto/trace/v1/trace.proto, common/v1, resource/v1), not
 * taken from the exporter: it checks what the exporter actually sends.
 */
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { pathToFileURL } from 'node:url'

export interface DecodedSpan {
  service: string
  traceId: string
  spanId: string
  /** '' for a root span. */
  parentSpanId: string
  name: string
  /** 1 internal, 2 server, 3 client, 4 producer, 5 consumer. */
  kind: number
  /** Unix epoch nanoseconds. */
  startNs: bigint
  endNs: bigint
  attributes: Record<string, unknown>
  /** 0 unset, 1 ok, 2 error. */
  statusCode: number
  /** The trace flags field (bit 8 and 9: whether the parent is remote). */
  flags: number
}

type Field = { no: number; type: number; int: bigint; bytes: Buffer }

/** The fields of one protobuf message, in order. */
function fields (buf: Buffer): Field[] {
  const out: Field[] = []
  let pos = 0
  const varint = (): bigint => {
    let result = 0n
    let shift = 0n
    for (;;) {
      const byte = buf[pos++]
      if (byte === undefined) throw new Error('truncated varint')
      result |= BigInt(byte & 0x7f) << shift
      if ((byte & 0x80) === 0) return result
      shift += 7n
    }
  }
  while (pos < buf.length) {
    const key = Number(varint())
    const no = key >>> 3
    const type = key & 7
    if (type === 0) out.push({ no, type, int: varint(), bytes: Buffer.alloc(0) })
    else if (type === 1) {
      out.push({ no, type, int: buf.readBigUInt64LE(pos), bytes: buf.subarray(pos, pos + 8) })
      pos += 8
    } else if (type === 5) {
      out.push({ no, type, int: BigInt(buf.readUInt32LE(pos)), bytes: buf.subarray(pos, pos + 4) })
      pos += 4
    } else if (type === 2) {
      const len = Number(varint())
      out.push({ no, type, int: 0n, bytes: buf.subarray(pos, pos + len) })
      pos += len
    } else throw new Error(`unsupported wire type ${type}`)
  }
  return out
}

function anyValue (buf: Buffer): unknown {
  for (const f of fields(buf)) {
    switch (f.no) {
      case 1:
        return f.bytes.toString('utf8')
      case 2:
        return f.int !== 0n
      case 3:
        return Number(BigInt.asIntN(64, f.int))
      case 4:
        return f.bytes.readDoubleLE(0)
      case 5:
        return fields(f.bytes)
          .filter((v) => v.no === 1)
          .map((v) => anyValue(v.bytes))
      case 6:
        return keyValues(fields(f.bytes).filter((v) => v.no === 1))
      case 7:
        return f.bytes.toString('hex')
    }
  }
  return undefined
}

function keyValues (list: Field[]): Record<string, unknown> {
  const out: Record<string, unknown> = {}
  for (const kv of list) {
    let key = ''
    let value: unknown
    for (const f of fields(kv.bytes)) {
      if (f.no === 1) key = f.bytes.toString('utf8')
      else if (f.no === 2) value = anyValue(f.bytes)
    }
    out[key] = value
  }
  return out
}

/** An ExportTraceServiceRequest's spans, each with its resource's service.name. */
export function decodeTraceRequest (body: Buffer): DecodedSpan[] {
  const spans: DecodedSpan[] = []
  for (const rs of fields(body).filter((f) => f.no === 1)) {
    const rsFields = fields(rs.bytes)
    const resource = rsFields.find((f) => f.no === 1)
    const resourceAttrs = resource === undefined ? {} : keyValues(fields(resource.bytes).filter((f) => f.no === 1))
    const service = String(resourceAttrs['service.name'] ?? '')
    for (const ss of rsFields.filter((f) => f.no === 2)) {
      for (const s of fields(ss.bytes).filter((f) => f.no === 2)) {
        const span: DecodedSpan = {
          service,
          traceId: '',
          spanId: '',
          parentSpanId: '',
          name: '',
          kind: 0,
          startNs: 0n,
          endNs: 0n,
          attributes: {},
          statusCode: 0,
          flags: 0
        }
        const attrs: Field[] = []
        for (const f of fields(s.bytes)) {
          if (f.no === 1) span.traceId = f.bytes.toString('hex')
          else if (f.no === 2) span.spanId = f.bytes.toString('hex')
          else if (f.no === 4) span.parentSpanId = f.bytes.toString('hex')
          else if (f.no === 5) span.name = f.bytes.toString('utf8')
          else if (f.no === 6) span.kind = Number(f.int)
          else if (f.no === 7) span.startNs = f.int
          else if (f.no === 8) span.endNs = f.int
          else if (f.no === 9) attrs.push(f)
          else if (f.no === 15) span.statusCode = Number(fields(f.bytes).find((g) => g.no === 3)?.int ?? 0n)
          else if (f.no === 16) span.flags = Number(f.int)
        }
        span.attributes = keyValues(attrs)
        spans.push(span)
      }
    }
  }
  return spans
}

export type SinkMode = 'accept' | 'hang' | 'refuse'

export interface OtlpSink {
  url: string
  port: number
  /** Every span decoded so far (when kept). */
  spans: DecodedSpan[]
  /** Every request body as received, for searching the raw bytes. */
  bodies: Buffer[]
  requests: number
  mode: SinkMode
  /** Resolves once `check(spans)` holds, re-checked as each export arrives; rejects after `ms`. */
  until: (check: (spans: DecodedSpan[]) => boolean, ms?: number) => Promise<DecodedSpan[]>
  close: () => Promise<void>
}

/** A receiver on loopback. `keep`: decode and keep every span (tests); else discard (the bench). */
export async function startOtlpSink (
  opts: { keep?: boolean; mode?: SinkMode; port?: number; host?: string } = {}
): Promise<OtlpSink> {
  const keep = opts.keep ?? true
  const waiters = new Set<() => void>()
  const hung = new Set<import('node:http').ServerResponse>()
  const sink: OtlpSink = {
    url: '',
    port: 0,
    spans: [],
    bodies: [],
    requests: 0,
    mode: opts.mode ?? 'accept',
    until: async (check, ms = 10_000) =>
      await new Promise((resolve, reject) => {
        const test = (): void => {
          if (!check(sink.spans)) return
          waiters.delete(test)
          clearTimeout(timer)
          resolve(sink.spans)
        }
        const timer = setTimeout(() => {
          waiters.delete(test)
          reject(new Error(`spans not received within ${ms} ms (${sink.spans.length} so far)`))
        }, ms)
        waiters.add(test)
        test()
      }),
    close: async () => {
      for (const res of hung) res.destroy()
      server.closeAllConnections()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    }
  }
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => {
      if (keep) chunks.push(c)
    })
    req.on('end', () => {
      sink.requests++
      if (sink.mode === 'hang') {
        hung.add(res)
        res.on('close', () => hung.delete(res))
        return
      }
      if (sink.mode === 'refuse') {
        res.writeHead(503, { 'content-type': 'text/plain', 'retry-after': '60' }).end('collector unavailable')
        return
      }
      if (keep && req.url === '/v1/traces') {
        const body = Buffer.concat(chunks)
        sink.bodies.push(body)
        sink.spans.push(...decodeTraceRequest(body))
      }
      // An empty ExportTraceServiceResponse: every span accepted.
      res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end()
      for (const w of [...waiters]) w()
    })
  })
  await new Promise<void>((resolve) => server.listen(opts.port ?? 0, opts.host ?? '127.0.0.1', resolve))
  sink.port = (server.address() as AddressInfo).port
  sink.url = `http://127.0.0.1:${sink.port}`
  return sink
}

/**
 * The sink as a process of its own (the bench's collector: its work must not
 * share the load generator's CPU time). Stopped when this process exits.
 */
export async function startOtlpSinkProcess (): Promise<{ url: string; stop: () => void }> {
  const child = spawn(process.execPath, [new URL(import.meta.url).pathname, '0'], {
    stdio: ['ignore', 'pipe', 'inherit']
  })
  const stop = (): void => {
    if (child.exitCode === null) child.kill('SIGTERM')
  }
  process.once('exit', stop)
  let text = ''
  for await (const chunk of child.stdout) {
    text += String(chunk)
    const port = /otlp sink listening on (\d+)/.exec(text)?.[1]
    if (port !== undefined) {
      // The sink never keeps the harness alive: it is stopped when the harness exits.
      child.unref()
      return { url: `http://127.0.0.1:${port}`, stop }
    }
  }
  await once(child, 'exit')
  throw new Error(`the OTLP sink did not start: ${text}`)
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const sink = await startOtlpSink({ keep: false, port: Number(process.argv[2] ?? 0) })
  process.stdout.write(`otlp sink listening on ${sink.port}\n`)
  const stop = (): void => {
    void sink.close().then(() => process.exit(0))
  }
  process.once('SIGTERM', stop)
  process.once('SIGINT', stop)
}
