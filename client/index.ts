/**
 * A typed client for the gateway: the types come from openapi.json (itself
 * generated from the schemas that validate requests) through
 * openapi-typescript, the calls from openapi-fetch. One method per operation,
 * named by its operationId; every answer is a value or an error typed by its
 * status, so a `switch (result.status)` narrows the error body, and a
 * structured error's `code` is the enum that status allows.
 *
 *   const gateway = createGatewayClient({ baseUrl: 'https://gw.example', token })
 *   const created = await gateway.createPortfolio({ name: 'Blue chips', type: 'PORTFOLIO', image: png })
 *   if (!created.ok && created.status === 409) retryIn(created.retryAfter)
 */
import createClient, { type Middleware } from 'openapi-fetch'
import type { components, operations, paths } from './schema.js'

export type { components, operations, paths } from './schema.js'

type Schemas = components['schemas']
export type SimpleError = Schemas['SimpleError']
export type ValidationError = Schemas['ValidationError']
export type UpdatePortfolioBody = Schemas['UpdatePortfolioBody']
export type UpdatePortfolioResponse = Schemas['UpdatePortfolioResponse']
export type CreatePortfolioResponse = Schemas['CreatePortfolioResponse']
export type ApiHealth = Schemas['ApiHealth']
/** Every structured error the gateway or the engine sends, by its code. */
export type StructuredError =
  | Schemas['ValidationError'] | Schemas['NotFoundError'] | Schemas['IdempotencyKeyInUseError'] |
  Schemas['IdempotencyKeyReusedError'] | Schemas['InternalError']

/** The create form's fields with the image as bytes instead of the document's binary string. */
export type CreatePortfolioInput = Omit<Schemas['CreatePortfolioForm'], 'image'> & {
  image?: Blob | Uint8Array
  /** The image part's file name; the gateway recognises the type by its bytes. */
  filename?: string
}

type OperationId = keyof operations
type Responses<Op extends OperationId> = operations[Op]['responses']
/** A response's body: its one media type's schema. */
type BodyOf<R> = R extends { content: infer C } ? C[keyof C] : never

interface Common {
  /** The x-request-id the gateway answered with: give it to whoever reads the logs. */
  requestId: string
  /** Retry-After in seconds, on the answers that ask the client to wait (409, 429, 503). */
  retryAfter?: number
}

/** The 200 of `Op`: its body, and whether it is a stored answer to a repeated Idempotency-Key. */
export type Success<Op extends OperationId> = Common & {
  ok: true
  status: 200
  data: BodyOf<Responses<Op>[200 & keyof Responses<Op>]>
  replayed: boolean
}
/** Each other status `Op` declares, with its own body: narrow on `status`, then on a structured error's `code`. */
export type Failure<Op extends OperationId> = {
  [S in Exclude<keyof Responses<Op>, 200>]: Common & { ok: false, status: S, error: BodyOf<Responses<Op>[S]> }
}[Exclude<keyof Responses<Op>, 200>]
export type Result<Op extends OperationId> = Success<Op> | Failure<Op>

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

/** Errors of a call read as text (ping's) are JSON all the same. */
function parsed (error: unknown): unknown {
  if (typeof error !== 'string') return error
  try {
    return JSON.parse(error)
  } catch {
    return { error }
  }
}

/** The answer as `Op` declares it: the document lists every status, so the status picks the body's type. */
function result<Op extends OperationId> (outcome: { data?: unknown, error?: unknown, response: Response }): Result<Op> {
  const { response } = outcome
  const retryAfter = response.headers.get('retry-after')
  const common: Common = {
    requestId: response.headers.get('x-request-id') ?? '',
    ...(retryAfter === null ? {} : { retryAfter: Number(retryAfter) })
  }
  if (response.status === 200) {
    const replayed = response.headers.get('idempotent-replayed') === 'true'
    return { ...common, ok: true, status: 200, data: outcome.data, replayed } as Result<Op>
  }
  return { ...common, ok: false, status: response.status, error: parsed(outcome.error) } as Result<Op>
}

export function createGatewayClient (options: GatewayClientOptions) {
  const client = createClient<paths>({
    baseUrl: options.baseUrl.replace(/\/$/, ''),
    ...(options.fetch === undefined ? {} : { fetch: options.fetch })
  })
  const bearer: Middleware = {
    async onRequest ({ request, schemaPath }) {
      // The public operations send no token.
      if (!schemaPath.startsWith('/api/')) return request
      const token = typeof options.token === 'string' ? options.token : await options.token()
      request.headers.set('authorization', `Bearer ${token}`)
      return request
    }
  }
  client.use(bearer)
  const init = (opts: CallOptions) =>
    ({ headers: requestHeaders(opts), ...(opts.signal === undefined ? {} : { signal: opts.signal }) })

  return {
    /** GET /health: liveness of the gateway. */
    async getLiveness (opts: CallOptions = {}): Promise<Result<'getLiveness'>> {
      return result(await client.GET('/health', init(opts)))
    },

    /** GET /ping: the gateway answers. */
    async ping (opts: CallOptions = {}): Promise<Result<'ping'>> {
      return result(await client.GET('/ping', init(opts)))
    },

    /** GET /openapi.json: the document these types come from. */
    async getOpenApiDocument (opts: CallOptions = {}): Promise<Result<'getOpenApiDocument'>> {
      return result(await client.GET('/openapi.json', init(opts)))
    },

    /** GET /api/health: the engine's services. */
    async getEngineHealth (opts: CallOptions = {}): Promise<Result<'getEngineHealth'>> {
      return result(await client.GET('/api/health', init(opts)))
    },

    /** GET /api/portfolio/ping: 'pong' from the engine. */
    async pingEngine (opts: CallOptions = {}): Promise<Result<'pingEngine'>> {
      return result(await client.GET('/api/portfolio/ping', { parseAs: 'text', ...init(opts) }))
    },

    /** POST /api/portfolio/create: multipart, the image as a Blob, Buffer or Uint8Array. */
    async createPortfolio (input: CreatePortfolioInput, opts: CallOptions = {}): Promise<Result<'createPortfolio'>> {
      return result(await client.POST('/api/portfolio/create', {
        // The document types the image as a binary string; the form carries the bytes.
        body: input as unknown as Schemas['CreatePortfolioForm'],
        bodySerializer: () => createForm(input),
        ...init(opts)
      }))
    },

    /** POST /api/portfolio/update: new target positions, allocations summing to 1. */
    async updatePortfolio (body: UpdatePortfolioBody, opts: CallOptions = {}): Promise<Result<'updatePortfolio'>> {
      return result(await client.POST('/api/portfolio/update', { body, ...init(opts) }))
    }
  }
}

export type GatewayClient = ReturnType<typeof createGatewayClient>
