/**
 * The document is the contract: every answer a gateway built by the test
 * helpers sends is held to openapi.json, its status, its body's schema, and
 * its headers (each declared, each required one present, each value of its
 * schema). `build()` watches every gateway it starts; a test that got an
 * answer the document does not declare fails in its teardown.
 *
 * How many answers were checked is appended, per test process, to
 * dist/answers-checked.log (`<pid> <checked> <violations>`), for the total
 * over a whole run.
 */
import { appendFileSync, readFileSync } from 'node:fs'
import type { IncomingMessage, Server, ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import { join } from 'node:path'
import { Ajv2020 } from 'ajv/dist/2020.js'
import addFormats from 'ajv-formats'
import { routerPath } from '../../src/http/router-path.js'
import { ROOT } from './processes.js'

type Json = Record<string, unknown>
interface Answer { method: string, url: string, status: number, headers: Record<string, string>, body: Buffer }

export const COUNT_FILE = join(ROOT, 'dist', 'answers-checked.log')
/** Headers HTTP itself owns (framing, the connection, the date): no document declares them. */
const HTTP_OWN = new Set(['content-type', 'content-length', 'transfer-encoding', 'connection', 'keep-alive', 'date'])

const DOCUMENT_ID = 'https://portfolio-gateway/openapi.json'
let loaded: { doc: Json, ajv: Ajv2020 } | undefined
function document (): { doc: Json, ajv: Ajv2020 } {
  if (loaded !== undefined) return loaded
  const doc = JSON.parse(readFileSync(join(ROOT, 'openapi.json'), 'utf8')) as Json
  const ajv = new Ajv2020({ strict: false, allErrors: true })
  addFormats.default(ajv)
  ajv.addFormat('solana-address', true)
  ajv.addSchema({ ...doc, $id: DOCUMENT_ID })
  loaded = { doc, ajv }
  return loaded
}

const pointer = (...parts: string[]): string => parts.map((p) => p.replace(/~/g, '~0').replace(/\//g, '~1')).join('/')

/** The response object at `where` (a JSON pointer into the document), its $ref followed. */
function responseAt (doc: Json, where: string): { object: Json, where: string } | undefined {
  let object: unknown = doc
  for (const part of where.split('/').slice(1)) {
    object = (object as Json | undefined)?.[part.replace(/~1/g, '/').replace(/~0/g, '~')]
  }
  if (object === undefined) return undefined
  const ref = (object as Json).$ref
  return typeof ref === 'string' ? responseAt(doc, ref.slice(1)) : { object: object as Json, where }
}

/** Where the document declares this answer: its operation's, or what it says of requests matching none. */
function declaration (doc: Json, answer: Answer): { object: Json, where: string } | string {
  // The path as the gateway's router reads it (absolute targets, percent-encoding); one it cannot read is any path's.
  const path = routerPath(answer.url)
  if (path === undefined) return rawDeclaration(doc, answer)
  const method = answer.method === 'HEAD' ? 'get' : answer.method.toLowerCase()
  const paths = doc.paths as Record<string, Record<string, Json>>
  const status = String(answer.status)
  if (paths[path]?.[method] !== undefined) {
    return responseAt(doc, `/${pointer('paths', path, method, 'responses', status)}`) ??
      `${answer.method} ${path} answered ${status}, which its operation does not declare`
  }
  // No sibling operation's declaration stands in: what a request matching none gets is x-unmatched-requests' alone.
  return responseAt(doc, `/${pointer('x-unmatched-requests', status)}`) ??
    `${answer.method} ${path} matches no operation, and ${status} is not declared for such requests`
}

/** Any operation's declaration of this status: for answers that can come to a request for any path. */
function rawDeclaration (doc: Json, answer: Answer): { object: Json, where: string } | string {
  for (const [path, operations] of Object.entries(doc.paths as Record<string, Record<string, Json>>)) {
    for (const method of Object.keys(operations)) {
      const found = responseAt(doc, `/${pointer('paths', path, method, 'responses', String(answer.status))}`)
      if (found !== undefined) return found
    }
  }
  return `${answer.method} ${answer.url} (a target the router cannot read) answered ${answer.status}, declared nowhere`
}

const validators = new Map<string, (value: unknown) => boolean>()
function validator (ajv: Ajv2020, where: string): (value: unknown) => boolean {
  let validate = validators.get(where)
  if (validate === undefined) {
    const compiled = ajv.compile({ $ref: `${DOCUMENT_ID}#${where}` })
    validate = (value) => compiled(value) === true
    validators.set(where, validate)
  }
  return validate
}

/**
 * Compile every body and header schema of the document now: a gateway
 * process does it before it listens, so no answer waits on a compile (its
 * shedder would read the pause as an overloaded event loop).
 */
export function precompile (): void {
  const { doc, ajv } = document()
  const walk = (value: unknown, where: string): void => {
    if (typeof value !== 'object' || value === null) return
    for (const [key, child] of Object.entries(value)) {
      const at = `${where}/${pointer(key)}`
      if (key === 'schema' && /\/(content\/[^/]+|headers\/[^/]+)\/schema$/.test(at)) validator(ajv, at)
      else walk(child, at)
    }
  }
  walk(doc, '')
}

/** What is wrong with `answer` by the document; empty when nothing is. */
export function violationsOf (answer: Answer): string[] {
  const { doc, ajv } = document()
  const found = declaration(doc, answer)
  if (typeof found === 'string') return [found]
  const { object, where } = found
  const what = `${answer.method} ${answer.url.split('?')[0]} ${answer.status}`
  const problems: string[] = []
  const declared = (object.headers ?? {}) as Record<string, Json>
  for (const [name, value] of Object.entries(answer.headers)) {
    if (HTTP_OWN.has(name)) continue
    const header = Object.keys(declared).find((key) => key.toLowerCase() === name)
    if (header === undefined) {
      problems.push(`${what}: header ${name} is sent but not declared`)
      continue
    }
    let headerWhere = `${where}/headers/${pointer(header)}`
    const ref = declared[header]!.$ref
    if (typeof ref === 'string') headerWhere = ref.slice(1)
    const schema = responseAt(doc, headerWhere)?.object.schema as Json | undefined
    const typed = schema?.type === 'integer' && /^\d+$/.test(value) ? Number(value) : value
    if (!validator(ajv, `${headerWhere}/schema`)(typed)) {
      problems.push(`${what}: header ${name}: ${value} is not of its schema`)
    }
  }
  for (const [name, header] of Object.entries(declared)) {
    const ref = header.$ref
    const resolved = typeof ref === 'string' ? responseAt(doc, ref.slice(1))?.object : header
    if (resolved?.required === true && answer.headers[name.toLowerCase()] === undefined) {
      problems.push(`${what}: required header ${name} is missing`)
    }
  }
  if (answer.method === 'HEAD') return problems
  const content = object.content as Record<string, Json> | undefined
  const type = (answer.headers['content-type'] ?? '').split(';')[0]!.trim()
  if (content === undefined) {
    if (answer.body.length > 0) problems.push(`${what}: a body is sent but none is declared`)
    return problems
  }
  if (content[type] === undefined) return [...problems, `${what}: content-type ${type || '(none)'} is not declared`]
  const text = answer.body.toString('utf8')
  let value: unknown = text
  if (type === 'application/json') {
    try {
      value = JSON.parse(text)
    } catch {
      return [...problems, `${what}: the body is not JSON`]
    }
  }
  if (!validator(ajv, `${where}/content/${pointer(type)}/schema`)(value)) {
    problems.push(`${what}: the body ${text.slice(0, 200)} is not of its schema`)
  }
  return problems
}

/**
 * An answer written straight to the socket (the parser's, client-error.ts),
 * for no request the router read: held to what any operation declares for
 * its status, since it can answer a request for any path.
 */
export function violationsOfRaw (answer: Omit<Answer, 'method' | 'url'>): string[] {
  const { doc } = document()
  let first: string[] | undefined
  for (const [path, operations] of Object.entries(doc.paths as Record<string, Record<string, Json>>)) {
    for (const method of Object.keys(operations)) {
      const found = violationsOf({ ...answer, method: method.toUpperCase(), url: path })
      if (found.length === 0) return []
      first ??= found
    }
  }
  return first!.map((problem) => `raw answer: ${problem}`)
}

let checked = 0
let violated = 0
/** A gateway process writes its counts as it goes (answer-check-child.ts): it is killed, never ends. */
let countsAtExit = true
export const countAsYouGo = (): void => { countsAtExit = false }
process.once('exit', () => {
  if (countsAtExit && checked > 0) appendFileSync(COUNT_FILE, `${process.pid} ${checked} ${violated}\n`)
})

/** The raw head Node wrote (`res._header`): the status and every header, as the client reads them. */
function headOf (res: ServerResponse): { status: number, headers: Record<string, string> } {
  return parseHead((res as ServerResponse & { _header?: string | null })._header ?? '')
}

/** A whole answer written as one string: its head, and its body by content-length. */
function rawAnswer (text: string): Omit<Answer, 'method' | 'url'> {
  const end = text.indexOf('\r\n\r\n')
  const { status, headers } = parseHead(text.slice(0, end + 2))
  const body = Buffer.from(text.slice(end + 4), 'latin1').subarray(0, Number(headers['content-length'] ?? Infinity))
  return { status, headers, body }
}

function parseHead (head: string): { status: number, headers: Record<string, string> } {
  const [statusLine = '', ...lines] = head.split('\r\n')
  const headers: Record<string, string> = {}
  for (const line of lines) {
    const colon = line.indexOf(':')
    if (colon > 0) headers[line.slice(0, colon).toLowerCase()] = line.slice(colon + 1).trim()
  }
  return { status: Number(statusLine.split(' ')[1]), headers }
}

/** Count an answer checked, and keep what is wrong with it. */
function tally (violations: string[], found: string[]): void {
  checked++
  if (found.length > 0) violated++
  violations.push(...found)
}

/** What injecting needs of a Fastify instance: its `inject`, whose answers never pass the server's 'request' event. */
interface Injectable {
  inject: (...args: never[]) => unknown
}
interface Injected {
  statusCode: number
  headers: Record<string, string | string[] | number | undefined>
  rawPayload: Buffer
  raw: { req: { method?: string, url?: string } }
}

/**
 * Hold every answer of `app.inject(options)` to the document, as watchAnswers
 * does those on sockets: light-my-request never emits the server's 'request'
 * event. The chain and callback forms are refused, so no answer goes unchecked.
 */
export function checkInjects (app: Injectable, violations: string[]): void {
  const inject = (app.inject as (options: unknown) => Promise<Injected>).bind(app)
  app.inject = ((options?: unknown, ...rest: unknown[]) => {
    if (options === undefined || rest.length > 0) {
      throw new Error('inject: pass options and await; the answer is checked')
    }
    return inject(options).then((res) => {
      const headers: Record<string, string> = {}
      for (const [name, value] of Object.entries(res.headers)) {
        if (value !== undefined) headers[name.toLowerCase()] = Array.isArray(value) ? value.join(', ') : String(value)
      }
      const { method = 'GET', url = '/' } = res.raw.req
      tally(violations, violationsOf({ method, url, status: res.statusCode, headers, body: res.rawPayload }))
      return res
    })
  }) as typeof app.inject
}

/**
 * Watch every answer `server` sends through Node's response objects; the
 * violations found so far, for the test's teardown to fail on.
 */
export function watchAnswers (server: Server, report?: (found: string[]) => void): string[] {
  const violations: string[] = []
  const watch = (req: IncomingMessage, res: ServerResponse): void => {
    const chunks: Buffer[] = []
    const keep = (chunk: unknown, encoding?: unknown): void => {
      if (chunk === undefined || chunk === null || typeof chunk === 'function') return
      const text = typeof encoding === 'string' ? encoding as BufferEncoding : 'utf8'
      chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as string, text))
    }
    const write = res.write
    const end = res.end
    res.write = function (this: ServerResponse, chunk: unknown, ...rest: unknown[]) {
      keep(chunk, rest[0])
      return (write as (...args: unknown[]) => boolean).call(this, chunk, ...rest)
    } as typeof res.write
    res.end = function (this: ServerResponse, chunk?: unknown, ...rest: unknown[]) {
      keep(chunk, rest[0])
      return (end as (...args: unknown[]) => ServerResponse).call(this, chunk, ...rest)
    } as typeof res.end
    res.once('finish', () => {
      const { status, headers } = headOf(res)
      const body = Buffer.concat(chunks)
      record(violationsOf({ method: req.method ?? 'GET', url: req.url ?? '/', status, headers, body }))
    })
  }
  const record = (found: string[]): void => {
    tally(violations, found)
    report?.(found)
  }
  // Answers written on the socket itself, not through a response object: the head is not a response's own.
  server.on('connection', (socket: Socket & { _httpMessage?: ServerResponse | null }) => {
    const write = socket.write
    socket.write = function (this: typeof socket, chunk: unknown, ...rest: unknown[]) {
      if (typeof chunk === 'string' && chunk.startsWith('HTTP/1.1 ') && !chunk.startsWith('HTTP/1.1 1')) {
        const own = (socket._httpMessage as (ServerResponse & { _header?: string | null }) | null | undefined)?._header
        if (own == null || !chunk.startsWith(own)) record(violationsOfRaw(rawAnswer(chunk)))
      }
      return (write as (...args: unknown[]) => boolean).call(this, chunk, ...rest)
    } as typeof socket.write
  })
  // Node emits one of these three per request; the front server answers the last two itself.
  server.prependListener('request', watch)
  server.prependListener('checkContinue', watch)
  server.prependListener('checkExpectation', watch)
  return violations
}
