/**
 * A steady load through haproxy for the chaos test: several users, each with
 * an HTTP/1.1 worker (undici) and an HTTP/2 worker (node:http2), both over
 * TLS with the topology's CA, cycling through ping, update and a create that
 * carries an Idempotency-Key. A create that fails in a way a phone would
 * retry (502, 503, 504, 409, 429 with Retry-After, a broken connection) is sent again with the same
 * key until it gets its 200, as the interface asks of clients (DECISIONS 16).
 * Every attempt is recorded with its start, end and status.
 */
import { connect, constants, type ClientHttp2Session } from 'node:http2'
import { readFileSync } from 'node:fs'
import { setTimeout as sleep } from 'node:timers/promises'
import { Pool } from 'undici'
import { PNG_IMAGE } from '../../fixtures/images.js'
import { MINTS } from '../helpers/app.js'
import { multipartBody } from '../helpers/multipart.js'

export type Op = 'ping' | 'update' | 'create'
export type Proto = 'h1' | 'h2'

export interface Outcome {
  op: Op
  proto: Proto
  user: string
  start: number
  end: number
  /** The HTTP status, or the error code when no answer came. */
  status: number | string
  key?: string
  portfolioId?: string
  /** The start of the body of an answer other than 200, to tell whose answer it was (haproxy's, the gateway's). */
  body?: string
}

interface Request {
  method: 'GET' | 'POST'
  path: string
  headers: Record<string, string>
  body?: Buffer | string
}
interface Answer {
  status: number
  body: string
}
interface Transport {
  send: (req: Request) => Promise<Answer>
  close: () => Promise<void>
}

const TIMEOUT_MS = 20_000
/** Between two requests of one worker: a steady load, not a saturating one, on a shared 2-core runner. */
const PACE_MS = 15
const RETRYABLE = new Set<number | string>([409, 429, 502, 503, 504])

function http1 (origin: string, ca: string): Transport {
  const pool = new Pool(origin, {
    connections: 2,
    connect: { ca },
    headersTimeout: TIMEOUT_MS,
    bodyTimeout: TIMEOUT_MS,
    keepAliveTimeout: 4_000
  })
  return {
    send: async (req) => {
      const res = await pool.request({
        method: req.method,
        path: req.path,
        headers: req.headers,
        body: req.body ?? null
      })
      return { status: res.statusCode, body: await res.body.text() }
    },
    close: async () => await pool.close()
  }
}

function http2 (origin: string, ca: string): Transport {
  let session: ClientHttp2Session | undefined
  const open = (): ClientHttp2Session => {
    if (session === undefined || session.closed || session.destroyed) {
      const s = connect(origin, { ca })
      s.on('error', () => {}) // each stream reports its own failure
      session = s
    }
    return session
  }
  return {
    send: async (req) =>
      await new Promise<Answer>((resolve, reject) => {
        // A length, as phones send with a known body; without it haproxy would forward the body chunked.
        const length = req.body === undefined ? {} : { 'content-length': String(Buffer.byteLength(req.body)) }
        const stream = open().request({ ':method': req.method, ':path': req.path, ...req.headers, ...length })
        stream.setTimeout(TIMEOUT_MS, () => stream.close(constants.NGHTTP2_CANCEL))
        let status = 0
        let body = ''
        stream.on('response', (headers) => {
          status = Number(headers[':status'])
        })
        stream.setEncoding('utf8').on('data', (chunk: string) => {
          body += chunk
        })
        stream.on('end', () => resolve({ status, body }))
        stream.on('error', reject)
        stream.on('close', () => {
          if (status === 0) { reject(Object.assign(new Error('stream closed without an answer'), { code: `RST_${stream.rstCode}` })) }
        })
        stream.end(req.body)
      }),
    close: async () =>
      await new Promise<void>((resolve) => {
        if (session === undefined || session.closed) resolve()
        else session.close(() => resolve())
      })
  }
}

export interface LoadOptions {
  origin: string
  caFile: string
  /** user -> token */
  tokens: Map<string, string>
}

export class Load {
  readonly outcomes: Outcome[] = []
  /** Each user's first portfolio, which their updates change. */
  readonly portfolios = new Map<string, string>()
  private stopping = false
  private giveUpAt = Infinity
  private workers: Array<Promise<void>> = []
  private readonly transports: Transport[] = []
  private readonly image = readFileSync(PNG_IMAGE)
  private keys = 0
  /** The start of each attempt still waiting for its answer. */
  private readonly pending = new Set<{ start: number }>()
  /** Told after each attempt ends (settled() waits on them). */
  private readonly ended = new Set<() => void>()

  constructor (private readonly opts: LoadOptions) {}

  /** Resolves once no attempt that started before `before` (performance.now()) is still waiting for its answer. */
  async settled (before: number): Promise<void> {
    const done = (): boolean => ![...this.pending].some((p) => p.start < before)
    if (done()) return
    await new Promise<void>((resolve) => {
      const check = (): void => {
        if (!done()) return
        this.ended.delete(check)
        resolve()
      }
      this.ended.add(check)
    })
  }

  private transport (proto: Proto): Transport {
    const ca = readFileSync(this.opts.caFile, 'utf8')
    const t = proto === 'h1' ? http1(this.opts.origin, ca) : http2(this.opts.origin, ca)
    this.transports.push(t)
    return t
  }

  private async attempt (
    t: Transport,
    proto: Proto,
    user: string,
    op: Op,
    req: Request,
    key?: string
  ): Promise<Outcome> {
    const start = performance.now()
    const mine = { start }
    this.pending.add(mine)
    let outcome: Outcome
    try {
      const answer = await t.send(req)
      outcome = { op, proto, user, start, end: performance.now(), status: answer.status }
      if (op === 'create' && answer.status === 200) { outcome.portfolioId = (JSON.parse(answer.body) as { portfolio_id: string }).portfolio_id }
      if (answer.status !== 200) outcome.body = answer.body.slice(0, 160)
    } catch (err) {
      outcome = {
        op,
        proto,
        user,
        start,
        end: performance.now(),
        status: (err as NodeJS.ErrnoException).code ?? 'error'
      }
    }
    if (key !== undefined) outcome.key = key
    this.outcomes.push(outcome)
    this.pending.delete(mine)
    for (const check of [...this.ended]) check()
    return outcome
  }

  /** A keyed create, sent again with the same key until it gets 200 (or the load gives up, long after it stopped). */
  async create (t: Transport, proto: Proto, user: string): Promise<string | undefined> {
    const key = `${user}-${++this.keys}`
    const form = multipartBody([
      { name: 'name', value: `chaos ${key}` },
      { name: 'type', value: 'PORTFOLIO' },
      { name: 'image', filename: 'tiny.png', contentType: 'image/png', data: this.image }
    ])
    const headers = {
      authorization: `Bearer ${this.opts.tokens.get(user)!}`,
      'content-type': form.contentType,
      'idempotency-key': key
    }
    for (;;) {
      const outcome = await this.attempt(
        t,
        proto,
        user,
        'create',
        { method: 'POST', path: '/api/portfolio/create', headers, body: form.body },
        key
      )
      if (outcome.status === 200) return outcome.portfolioId
      const retryable = typeof outcome.status === 'string' || RETRYABLE.has(outcome.status)
      if (!retryable || performance.now() > this.giveUpAt) return undefined
      await sleep(100)
    }
  }

  private async worker (user: string, proto: Proto): Promise<void> {
    const t = this.transport(proto)
    const auth = { authorization: `Bearer ${this.opts.tokens.get(user)!}` }
    for (let i = 0; !this.stopping; i++) {
      const op: Op = (['ping', 'update', 'create'] as const)[i % 3]!
      if (op === 'ping') { await this.attempt(t, proto, user, op, { method: 'GET', path: '/api/portfolio/ping', headers: auth }) } else if (op === 'create') await this.create(t, proto, user)
      else {
        const body = JSON.stringify({
          portfolio_id: this.portfolios.get(user),
          target_positions: [{ mint: MINTS[i % MINTS.length], allocation: 1 }]
        })
        await this.attempt(t, proto, user, op, {
          method: 'POST',
          path: '/api/portfolio/update',
          headers: { ...auth, 'content-type': 'application/json' },
          body
        })
      }
      await sleep(PACE_MS)
    }
  }

  /** Give every user a portfolio to update, then start two workers per user (HTTP/1.1 and HTTP/2). */
  async start (): Promise<void> {
    const setup = this.transport('h1')
    for (const user of this.opts.tokens.keys()) {
      const id = await this.create(setup, 'h1', user)
      if (id === undefined) throw new Error(`setup: no portfolio for ${user}`)
      this.portfolios.set(user, id)
    }
    for (const user of this.opts.tokens.keys()) this.workers.push(this.worker(user, 'h1'), this.worker(user, 'h2'))
  }

  /** Stop sending new requests; creates still retrying get `graceMs` to finish. */
  async stop (graceMs = 20_000): Promise<void> {
    if (this.stopping) return
    this.stopping = true
    this.giveUpAt = performance.now() + graceMs
    await Promise.all(this.workers)
    await Promise.all(this.transports.map(async (t) => await t.close()))
  }
}
