/**
 * Clients that people use, each sending one request and reporting what it got:
 * python3's http.client and a raw socket write their whole body before they
 * read (so a gateway that closes with body bytes unread costs them the answer),
 * undici's fetch and curl (which sends `Expect: 100-continue` above 1 MiB).
 * Each returns an Outcome instead of throwing: the status and body it read, or
 * the error it saw (EPIPE, ECONNRESET, BrokenPipeError, ...), and how long it took.
 */
import { execFile } from 'node:child_process'
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { connect } from 'node:net'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { fetch } from 'undici'

export interface ClientRequest {
  method?: string
  path: string
  headers: Record<string, string>
  body: Buffer
  /** Sent with `transfer-encoding: chunked` instead of a content-length (python and the raw socket). */
  chunked?: boolean
  /** Bytes per second: the body goes out paced to it (python, the raw socket and curl), as over a slow link. */
  rate?: number
}

export interface Outcome {
  status?: number
  body?: string
  headers?: Record<string, string>
  /** What the client saw instead of an answer. */
  error?: string
  ms: number
  /** The raw socket with Expect: 100-continue: an interim 100 came first. */
  continued?: boolean
}

export type Client = (url: string, req: ClientRequest) => Promise<Outcome>

const here = dirname(fileURLToPath(import.meta.url))
// Beside this file in the sources; from dist/test/helpers, in the sources' test/helpers.
const PYTHON_CLIENT = [
  join(here, 'write-first-client.py'),
  join(here, '..', '..', '..', 'test', 'helpers', 'write-first-client.py')
].find((file) => existsSync(file))!
const CLIENT_TIMEOUT_MS = 40_000

let dir: string | undefined
const files = new WeakMap<Buffer, string>()
let fileCount = 0
/** The body in a file, once per Buffer (python and curl read it from there). */
function fileOf (body: Buffer): string {
  let file = files.get(body)
  if (file !== undefined) return file
  if (dir === undefined) {
    const made = (dir = mkdtempSync(join(tmpdir(), 'write-first-')))
    process.once('exit', () => rmSync(made, { recursive: true, force: true }))
  }
  file = join(dir, `body-${fileCount++}`)
  writeFileSync(file, body)
  files.set(body, file)
  return file
}

/** How long a client may take: the usual bound, plus the time its body takes at its rate. */
export function timeoutFor (req: ClientRequest): number {
  return CLIENT_TIMEOUT_MS + (req.rate === undefined ? 0 : Math.ceil((req.body.length / req.rate) * 1000))
}

/** One line for a table or an assertion message: `400 {"error":...}` or `EPIPE after 5060 ms`. */
export function describe (o: Outcome): string {
  return o.error === undefined ? `${o.status!} ${o.body!}` : `${o.error} after ${o.ms} ms`
}

/** python3's http.client: the whole body, then the answer. */
export const viaPython: Client = async (url, req) => {
  const args = [
    PYTHON_CLIENT,
    url,
    req.method ?? 'POST',
    req.path,
    JSON.stringify(req.headers),
    fileOf(req.body),
    ...(req.chunked === true ? ['chunked'] : []),
    ...(req.rate === undefined ? [] : [`rate=${req.rate}`])
  ]
  return await new Promise((resolve) => {
    execFile('python3', args, { timeout: timeoutFor(req) }, (err, stdout) => {
      if (err !== null && stdout === '') {
        resolve({ error: `python3 failed: ${err.message}`, ms: CLIENT_TIMEOUT_MS })
        return
      }
      const out = JSON.parse(stdout) as Outcome & { detail?: string }
      resolve(out)
    })
  })
}

function head (url: URL, req: ClientRequest, extra: Record<string, string> = {}): string {
  const headers = {
    host: url.host,
    ...req.headers,
    ...extra,
    ...(req.chunked === true ? { 'transfer-encoding': 'chunked' } : { 'content-length': String(req.body.length) })
  }
  return `${req.method ?? 'POST'} ${req.path} HTTP/1.1\r\n${Object.entries(headers)
    .map(([k, v]) => `${k}: ${v}\r\n`)
    .join('')}\r\n`
}

function framed (req: ClientRequest): Buffer {
  if (req.chunked !== true) return req.body
  const out: Buffer[] = []
  for (let at = 0; at < req.body.length; at += 65536) {
    const piece = req.body.subarray(at, at + 65536)
    out.push(Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from('\r\n'))
  }
  out.push(Buffer.from('0\r\n\r\n'))
  return Buffer.concat(out)
}

/** Parse what a raw socket read: interim 1xx answers, then one final answer (content-length framed). */
function parseAnswers (bytes: Buffer): { continued: boolean; final?: Omit<Outcome, 'ms'> } {
  let rest = bytes
  let continued = false
  for (;;) {
    const end = rest.indexOf('\r\n\r\n')
    if (end === -1) return { continued }
    const lines = rest.subarray(0, end).toString('latin1').split('\r\n')
    const status = Number(lines[0]!.split(' ')[1])
    const headers: Record<string, string> = {}
    for (const line of lines.slice(1)) {
      const colon = line.indexOf(':')
      headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim()
    }
    rest = rest.subarray(end + 4)
    if (status >= 100 && status < 200) {
      continued ||= status === 100
      continue
    }
    const length = Number(headers['content-length'] ?? rest.length)
    if (rest.length < length) return { continued }
    return { continued, final: { status, headers, body: rest.subarray(0, length).toString('utf8') } }
  }
}

/**
 * A raw socket that writes the request (head and whole body) before it reads
 * a byte, then reads until the answer is complete or the connection ends.
 * With `expectContinue`, it sends `Expect: 100-continue` and the head only,
 * sends the body only after a `100 Continue`, and records which came first.
 */
export async function rawSocket (
  url: string,
  req: ClientRequest,
  opts: { expectContinue?: boolean } = {}
): Promise<Outcome> {
  const target = new URL(url)
  const start = performance.now()
  const ms = (): number => Math.round(performance.now() - start)
  const socket = connect(Number(target.port), target.hostname)
  socket.pause()
  let read = Buffer.alloc(0)
  let failure: string | undefined
  let closed = false
  const finished = new Promise<void>((resolve) => {
    socket.on('data', (chunk: Buffer) => {
      read = Buffer.concat([read, chunk])
      if (parseAnswers(read).final !== undefined) resolve()
    })
    socket.on('error', (err: NodeJS.ErrnoException) => {
      failure ??= err.code ?? err.message
      resolve()
    })
    socket.on('close', () => {
      closed = true
      resolve()
    })
  })
  const timer = setTimeout(() => {
    failure ??= 'client timeout'
    socket.destroy()
  }, timeoutFor(req))
  const write = async (data: Buffer | string): Promise<void> =>
    await new Promise((resolve) => {
      socket.write(data, (err) => {
        if (err != null) failure ??= (err as NodeJS.ErrnoException).code ?? err.message
        resolve()
      })
    })
  try {
    if (opts.expectContinue === true) {
      await write(head(target, req, { expect: '100-continue' }))
      socket.resume()
      // Wait for the first answer: an interim 100 (then send the body) or the final one.
      const first = await new Promise<'continue' | 'final'>((resolve) => {
        const check = (): void => {
          if (read.indexOf('\r\n\r\n') === -1) return
          socket.off('data', check)
          resolve(read.subarray(0, 12).toString('latin1').startsWith('HTTP/1.1 100') ? 'continue' : 'final')
        }
        socket.on('data', check)
        socket.once('close', () => resolve('final'))
      })
      if (first === 'continue') await write(framed(req))
    } else {
      if (req.rate === undefined) await write(Buffer.concat([Buffer.from(head(target, req)), framed(req)]))
      else {
        await write(head(target, req))
        const body = framed(req)
        const from = performance.now()
        // 16 KiB writes, each once the rate allows it: the pace of a phone on a slow link.
        for (let at = 0; at < body.length && failure === undefined && !closed; at += 16 * 1024) {
          const due = from + (at / req.rate) * 1000 - performance.now()
          if (due > 0) await new Promise((resolve) => setTimeout(resolve, due))
          await write(body.subarray(at, at + 16 * 1024))
        }
      }
      socket.resume()
    }
    await finished
    const { continued, final } = parseAnswers(read)
    if (final !== undefined) return { ...final, ms: ms(), continued }
    return { error: failure ?? (closed ? 'closed without an answer' : 'no answer'), ms: ms(), continued }
  } finally {
    clearTimeout(timer)
    socket.destroy()
  }
}

export const viaRawSocket: Client = async (url, req) => await rawSocket(url, req)

/** undici's fetch (it writes the body as it goes and reads once the answer comes). */
export const viaFetch: Client = async (url, req) => {
  const start = performance.now()
  try {
    const res = await fetch(new URL(req.path, url), {
      method: req.method ?? 'POST',
      headers: req.headers,
      body: req.body,
      signal: AbortSignal.timeout(CLIENT_TIMEOUT_MS)
    })
    const body = await res.text()
    return {
      status: res.status,
      body,
      headers: Object.fromEntries(res.headers),
      ms: Math.round(performance.now() - start)
    }
  } catch (err) {
    const cause = (err as { cause?: { code?: string; message?: string } }).cause
    return { error: cause?.code ?? cause?.message ?? String(err), ms: Math.round(performance.now() - start) }
  }
}

/** curl with its defaults (Expect: 100-continue above 1 MiB). */
export const viaCurl: Client = async (url, req) => {
  const start = performance.now()
  const args = [
    '-sS',
    '-X',
    req.method ?? 'POST',
    ...Object.entries(req.headers).flatMap(([k, v]) => ['-H', `${k}: ${v}`]),
    ...(req.rate === undefined ? [] : ['--limit-rate', String(req.rate)]),
    '--data-binary',
    `@${fileOf(req.body)}`,
    '-w',
    '\n%{http_code}',
    new URL(req.path, url).href
  ]
  return await new Promise((resolve) => {
    execFile('curl', args, { timeout: timeoutFor(req), maxBuffer: 1 << 20 }, (err, stdout, stderr) => {
      const ms = Math.round(performance.now() - start)
      const cut = stdout.lastIndexOf('\n')
      const status = Number(stdout.slice(cut + 1))
      if (err !== null && !(status > 0)) {
        resolve({ error: stderr.trim().replace(/^curl: /, '') || err.message, ms })
        return
      }
      if (err !== null) {
        resolve({ error: `${stderr.trim().replace(/^curl: /, '')} (status ${status} read)`, ms })
        return
      }
      resolve({ status, body: stdout.slice(0, cut), ms })
    })
  })
}

export const CLIENTS: Readonly<Record<string, Client>> = {
  'python http.client': viaPython,
  'raw socket': viaRawSocket,
  'undici fetch': viaFetch,
  curl: viaCurl
}
