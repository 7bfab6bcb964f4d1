/**
 * A typed client for the gateway: the types come from openapi.json (itself
 * generated from the schemas that validate requests) through
 * openapi-typescript, the calls from openapi-fetch. Nothing here is written
 * twice: a change in the contract is a compile error in the app.
 *
 *   const gateway = createGatewayClient({ baseUrl: 'https://gw.example', token })
 *   const created = await gateway.create({ name: 'Blue chips', type: 'PORTFOLIO', image: png })
 *   if (!created.ok) throw new Error(errorMessage(created.error))
 *   await gateway.update({ portfolio_id: created.data.portfolio_id, target_positions: [...] })
 */
import createClient, { type Middleware } from 'openapi-fetch'
import type { components, paths } from './schema.js'

export type { components, paths } from './schema.js'

type Schemas = components['schemas']
export type SimpleError = Schemas['SimpleError']
export type StructuredError = Schemas['StructuredError']
export type UpdatePortfolioBody = Schemas['UpdatePortfolioBody']
export type UpdatePortfolioResponse = Schemas['UpdatePortfolioResponse']
export type CreatePortfolioResponse = Schemas['CreatePortfolioResponse']
export type ApiHealth = Schemas['ApiHealth']

/** The create form's fields with the image as bytes instead of the document's binary string. */
export type CreatePortfolioInput = Omit<Schemas['CreatePortfolioForm'], 'image'> & {
  image?: Blob | Uint8Array
  /** The image part's file name; the gateway recognises the type by its bytes. */
  filename?: string
}

/** Statuses whose body is the structured shape on create and update (DECISIONS 19). */
export type StructuredStatus = 400 | 404 | 409 | 422 | 500

/** Every call answers a value or a typed error, never throws for an HTTP status. */
export type Result<T, E> =
  | { ok: true, status: number, data: T, requestId: string }
  | { ok: false, status: number, error: E, requestId: string }

export interface CallOptions {
  /** draft-ietf-httpapi-idempotency-key-header; create and update only. */
  idempotencyKey?: string
  /** W3C traceparent to continue; the gateway starts a trace otherwise. */
  traceparent?: string
  requestId?: string
  signal?: AbortSignal
}

export interface GatewayClientOptions {
  baseUrl: string
  /** The bearer token, or a function that returns a fresh one for each call. */
  token: string | (() => string | Promise<string>)
  /** A fetch of your own (tests, proxies); the global one otherwise. */
  fetch?: (input: Request) => Promise<Response>
}

/** True for the structured error shape, with its code (VALIDATION_ERROR, NOT_FOUND, ...). */
export function isStructuredError (error: SimpleError | StructuredError): error is StructuredError {
  return 'success' in error
}

/** The human-readable message of either error shape. */
export function errorMessage (error: SimpleError | StructuredError): string {
  return isStructuredError(error) ? error.error.message : error.error
}

function requestHeaders (opts: CallOptions): Record<string, string> {
  const headers: Record<string, string> = {}
  if (opts.idempotencyKey !== undefined) headers['idempotency-key'] = opts.idempotencyKey
  if (opts.traceparent !== undefined) headers.traceparent = opts.traceparent
  if (opts.requestId !== undefined) headers['x-request-id'] = opts.requestId
  return headers
}

/** The create form, fields first (they are checked before the image streams), then the image. */
function createForm (input: CreatePortfolioInput): FormData {
  const form = new FormData()
  const { image, filename, ...fields } = input
  for (const [name, value] of Object.entries(fields)) if (value !== undefined) form.append(name, value)
  if (image !== undefined) {
    // A copy: Blob takes only ArrayBuffer-backed views, and a Buffer may sit on a shared pool.
    const blob = image instanceof Blob ? image : new Blob([new Uint8Array(image)])
    form.append('image', blob, filename ?? 'image')
  }
  return form
}

function result<T, E> (outcome: { data?: T, error?: E, response: Response }): Result<T, E> {
  const { response } = outcome
  const requestId = response.headers.get('x-request-id') ?? ''
  if (response.ok) return { ok: true, status: response.status, data: outcome.data as T, requestId }
  return { ok: false, status: response.status, error: outcome.error as E, requestId }
}

export function createGatewayClient (options: GatewayClientOptions) {
  const client = createClient<paths>({ baseUrl: options.baseUrl.replace(/\/$/, ''), ...(options.fetch === undefined ? {} : { fetch: options.fetch }) })
  const bearer: Middleware = {
    async onRequest ({ request }) {
      const token = typeof options.token === 'string' ? options.token : await options.token()
      request.headers.set('authorization', `Bearer ${token}`)
      return request
    }
  }
  client.use(bearer)

  return {
    /** GET /api/portfolio/ping: 'pong' from the engine. */
    async ping (opts: CallOptions = {}): Promise<Result<'pong', SimpleError>> {
      const outcome = await client.GET('/api/portfolio/ping', { parseAs: 'text', headers: requestHeaders(opts), ...(opts.signal === undefined ? {} : { signal: opts.signal }) })
      return result<'pong', SimpleError>({ ...outcome, data: outcome.data as 'pong' | undefined, error: parseError(outcome.error) })
    },

    /** GET /api/health: the engine's services. */
    async health (opts: CallOptions = {}): Promise<Result<ApiHealth, SimpleError>> {
      return result(await client.GET('/api/health', { headers: requestHeaders(opts), ...(opts.signal === undefined ? {} : { signal: opts.signal }) }))
    },

    /** POST /api/portfolio/create: multipart, the image as a Blob, Buffer or Uint8Array. */
    async create (input: CreatePortfolioInput, opts: CallOptions = {}): Promise<Result<CreatePortfolioResponse, StructuredError | SimpleError>> {
      return result(await client.POST('/api/portfolio/create', {
        // The document types the image as a binary string; the form carries the bytes.
        body: input as unknown as Schemas['CreatePortfolioForm'],
        bodySerializer: () => createForm(input),
        headers: requestHeaders(opts),
        ...(opts.signal === undefined ? {} : { signal: opts.signal })
      }))
    },

    /** POST /api/portfolio/update: new target positions, allocations summing to 1. */
    async update (body: UpdatePortfolioBody, opts: CallOptions = {}): Promise<Result<UpdatePortfolioResponse, StructuredError | SimpleError>> {
      return result(await client.POST('/api/portfolio/update', { body, headers: requestHeaders(opts), ...(opts.signal === undefined ? {} : { signal: opts.signal }) }))
    }
  }
}

export type GatewayClient = ReturnType<typeof createGatewayClient>

/** With parseAs 'text' errors arrive as text too: they are JSON (SimpleError). */
function parseError (error: unknown): SimpleError | undefined {
  if (typeof error !== 'string') return error as SimpleError | undefined
  try {
    return JSON.parse(error) as SimpleError
  } catch {
    return { error }
  }
}
