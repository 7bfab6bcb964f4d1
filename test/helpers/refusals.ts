/**
 * Every refusal of a create (and update's 400 on a body past its limit), as a
 * request any client can send and the exact answer it must read, with what
 * the gateway and the engine double need for it. Shared by the tests
 * (test/routes/create/early-answers-refusals-<kind>.test.ts, one file a kind) and the before/after table
 * (bench/refusals.ts), which runs them against any build of the gateway.
 */
import { json, startStubUpstream, type StubUpstream } from '../../fixtures/stub-upstream.js'
import {
  CREATE_FIELDS,
  createValidationError,
  imagePart,
  multipartBody,
  pngOfSize,
  type MultipartPart
} from './multipart.js'
import { hs256 } from './app.js'
import { slowCreate } from './slow-upload.js'
import type { Client, ClientRequest, Outcome } from './write-first.js'

export const KiB = 1024
export const MiB = 1024 * KiB
/** The body sizes of the table: a small image and one close to the 10 MiB limit. */
export const SIZES = { small: 1 * KiB, '9 MiB': 9 * MiB } as const
export type SizeName = keyof typeof SIZES

/** What a gateway for one refusal is built with (beside UPSTREAM_URL, the engine double). */
export interface GatewaySetup {
  env?: Record<string, string>
  uploadStallTimeoutMs?: number
}

/**
 * What refuses, which is what a test file of the refusals is about: the form's own fields and parts, a body
 * past its size limit, the fair-upload limits (the per-user cap, the upload connections), the engine's own
 * answer mid-upload, the engine's faults mid-upload.
 */
export const REFUSAL_KINDS = ['form', 'size', 'uploads', 'engine', 'engine-faults'] as const
export type RefusalKind = typeof REFUSAL_KINDS[number]

export interface Refusal {
  name: string
  kind: RefusalKind
  gateway?: GatewaySetup
  /** Makes the engine double behave (answer early, reset, stop reading). */
  engine?: (stub: StubUpstream) => void
  /**
   * Takes what the refusal needs before the client comes (the user's upload
   * places, the upload connections), for `sub`; resolves to a release.
   */
  hold?: (url: string, stub: StubUpstream) => Promise<() => void>
  /** Every client sends as HELD_USER (whose places `hold` took); otherwise each as a user of its own. */
  heldUser?: boolean
  request: (size: number, sub: string) => ClientRequest
  status: number
  /** The answer's JSON body (a function when it depends on the size). */
  body: unknown
  bodyFor?: (size: SizeName) => unknown
}

const GIF = Buffer.from('GIF89a')
const ENGINE_REFUSAL = {
  success: false,
  error: {
    source: 'portfolio-engine',
    code: 'VALIDATION_ERROR',
    message: 'image refused by the engine',
    function: 'createPortfolio'
  }
}

const forms = new Map<string, { body: Buffer; contentType: string }>()
/** One body per form and size, built once: the clients send the same bytes (and python and curl read them from one
 * file).
 */
function form (
  key: string,
  size: number,
  parts: (size: number) => MultipartPart[]
): { body: Buffer; contentType: string } {
  const id = `${key}/${size}`
  let made = forms.get(id)
  if (made === undefined) { forms.set(id, (made = multipartBody(parts(size), `----refusal-${key.replace(/\W/g, '')}-${size}`))) }
  return made
}

function create (
  sub: string,
  made: { body: Buffer; contentType: string },
  headers: Record<string, string> = {}
): ClientRequest {
  return {
    path: '/api/portfolio/create',
    headers: { authorization: `Bearer ${hs256({ sub })}`, 'content-type': made.contentType, ...headers },
    body: made.body
  }
}

const valid = (size: number): MultipartPart[] => [...CREATE_FIELDS, imagePart(pngOfSize(size))]
const gifOf = (size: number): Buffer => {
  const data = Buffer.alloc(size, 0x42)
  GIF.copy(data)
  return data
}

export const HELD_USER = 'held-user'

/** `count` creates of `sub` that hold their places and upload connections (streaming to the engine) until released. */
async function holdUploads (url: string, stub: StubUpstream, sub: string, count: number): Promise<() => void> {
  const held = Array.from({ length: count }, () => slowCreate(url, sub, { kind: 'hold' }, 64 * KiB))
  for (const h of held) h.answer.catch(() => {})
  const release = (): void => {
    for (const h of held) h.stop()
  }
  try {
    await started(stub, count)
  } catch (err) {
    release()
    throw err
  }
  return release
}

/** The engine double has begun `count` requests: the held creates are streaming. */
async function started (stub: StubUpstream, count: number): Promise<void> {
  const deadline = performance.now() + 10_000
  while (stub.stats.started < count) {
    if (performance.now() > deadline) { throw new Error(`the engine double saw ${stub.stats.started} of ${count} requests`) }
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

export const REFUSALS: readonly Refusal[] = [
  {
    name: 'bad field before the image',
    kind: 'form',
    request: (size, sub) =>
      create(
        sub,
        form('name-first', size, (s) => [
          { name: 'name', value: 'x'.repeat(40) },
          { name: 'type', value: 'PORTFOLIO' },
          imagePart(pngOfSize(s))
        ])
      ),
    status: 400,
    body: createValidationError('name must be at most 30 characters')
  },
  {
    name: 'bad field after the image',
    kind: 'form',
    request: (size, sub) =>
      create(
        sub,
        form('type-after', size, (s) => [
          { name: 'name', value: 'Blue chips' },
          imagePart(pngOfSize(s)),
          { name: 'type', value: 'NOPE' }
        ])
      ),
    status: 400,
    body: createValidationError('type must be one of PORTFOLIO, INDEX_PORTFOLIO')
  },
  {
    name: 'not an image',
    kind: 'form',
    request: (size, sub) =>
      create(
        sub,
        form('gif', size, (s) => [...CREATE_FIELDS, imagePart(gifOf(s), 'image/gif', 'a.gif')])
      ),
    status: 400,
    body: createValidationError('image must be a PNG or JPEG file')
  },
  {
    name: 'a second file',
    kind: 'form',
    request: (size, sub) =>
      create(
        sub,
        form('two-files', size, (s) => [...valid(s), imagePart(pngOfSize(1 * KiB), 'image/png', 'b.png')])
      ),
    status: 400,
    body: createValidationError('image must be given once')
  },
  {
    name: 'over the size limit',
    kind: 'size',
    // Past the limit whatever the column says: 10 MiB of image and the fields.
    request: (_size, sub) =>
      create(
        sub,
        form('too-large', 10 * MiB + 64 * KiB, (s) => [...CREATE_FIELDS, imagePart(pngOfSize(s))])
      ),
    status: 400,
    body: createValidationError(`body must be at most ${10 * MiB + 64 * KiB} bytes`)
  },
  {
    name: '429 too many uploads',
    kind: 'uploads',
    gateway: { env: { UPLOAD_MAX_PER_USER: '2' } },
    hold: async (url, stub) => await holdUploads(url, stub, HELD_USER, 2),
    heldUser: true,
    request: (size, sub) => create(sub, form('valid', size, valid)),
    status: 429,
    body: { error: 'at most 2 uploads per user at once' }
  },
  {
    name: '503 uploads busy',
    kind: 'uploads',
    gateway: { env: { UPLOAD_MAX_CONNECTIONS: '1' } },
    hold: async (url, stub) => await holdUploads(url, stub, 'holder', 1),
    engine: (stub) => {
      stub.reading = true
    },
    request: (size, sub) => create(sub, form('valid', size, valid)),
    status: 503,
    body: { error: 'too many uploads in progress, retry later' }
  },
  {
    name: 'engine answers mid-upload',
    kind: 'engine',
    engine: (stub) => {
      stub.early = (req, res) => {
        req.resume()
        json(res, 400, ENGINE_REFUSAL)
      }
    },
    request: (size, sub) => create(sub, form('valid', size, valid)),
    status: 400,
    body: ENGINE_REFUSAL
  },
  {
    name: 'engine answers mid-upload, Idempotency-Key',
    kind: 'engine',
    engine: (stub) => {
      stub.early = (req, res) => {
        req.resume()
        json(res, 400, ENGINE_REFUSAL)
      }
    },
    request: (size, sub) => create(sub, form('valid', size, valid), { 'idempotency-key': `early-${sub}` }),
    status: 400,
    body: ENGINE_REFUSAL
  },
  {
    name: '502 engine reset mid-upload',
    kind: 'engine-faults',
    engine: (stub) => {
      stub.early = (req) => {
        req.socket.resetAndDestroy()
      }
    },
    request: (size, sub) => create(sub, form('valid', size, valid)),
    status: 502,
    body: { error: 'portfolio engine unavailable' }
  },
  {
    name: '504 engine stops reading mid-upload',
    kind: 'engine-faults',
    gateway: { uploadStallTimeoutMs: 300 },
    engine: (stub) => {
      stub.reading = false
    },
    request: (size, sub) => create(sub, form('valid', size, valid)),
    status: 504,
    body: { error: 'portfolio engine stopped reading the upload' },
    // A small form fits in the sockets' buffers: the engine's silence is then the answer's timeout.
    bodyFor: (size) =>
      size === 'small'
        ? { error: 'portfolio engine timed out' }
        : { error: 'portfolio engine stopped reading the upload' }
  }
]

/** The size limit met by a chunked body, which declares nothing (python's http.client and the raw socket send it
 * chunked).
 */
export const CHUNKED_TOO_LARGE: Refusal = {
  name: 'over the size limit, chunked',
  kind: 'size',
  request: (_size, sub) => ({
    ...create(
      sub,
      form('too-large', 10 * MiB + 64 * KiB, (s) => [...CREATE_FIELDS, imagePart(pngOfSize(s))])
    ),
    chunked: true
  }),
  status: 400,
  // The image passes its own bound before the body passes the form's.
  body: createValidationError(`image must be at most ${10 * MiB} bytes`)
}

/** Update's 400 past its 64 KiB body limit: a 70 KiB JSON body, declared. */
export const UPDATE_TOO_LARGE: Refusal = {
  name: 'update body over its limit',
  kind: 'size',
  request: (_size, sub) => ({
    path: '/api/portfolio/update',
    headers: { authorization: `Bearer ${hs256({ sub })}`, 'content-type': 'application/json' },
    body: updateBody(70 * KiB)
  }),
  status: 400,
  body: {
    success: false,
    error: {
      source: 'portfolio-gateway',
      code: 'VALIDATION_ERROR',
      message: 'body must be at most 65536 bytes',
      function: 'updatePortfolio'
    }
  }
}

/** Every refusal the tests run: the create's, the chunked body's and update's. */
export const EVERY_REFUSAL: readonly Refusal[] = [...REFUSALS, CHUNKED_TOO_LARGE, UPDATE_TOO_LARGE]

/** The refusals of one kind, in their order above. */
export const refusalsOf = (kind: RefusalKind): Refusal[] => EVERY_REFUSAL.filter((r) => r.kind === kind)

let bigUpdate: Buffer | undefined
function updateBody (size: number): Buffer {
  const text = JSON.stringify({
    portfolio_id: 'p-1',
    target_positions: [{ mint: 'So11111111111111111111111111111111111111112', allocation: 1 }],
    pad: ''
  })
  return (bigUpdate ??= Buffer.from(text.replace('"pad":""', `"pad":"${'x'.repeat(size - text.length)}"`)))
}

/** A gateway for one refusal, in front of `upstreamUrl` (the tests' build(), or any build of the gateway for the
 * table).
 */
export type StartGateway = (
  upstreamUrl: string,
  setup: GatewaySetup
) => Promise<{ url: string; close: () => Promise<void> }>

export interface Run {
  refusal: string
  client: string
  size: SizeName
  outcome: Outcome
  expected: { status: number; body: unknown }
}

/**
 * Send `refusal` from each client at each size, all at once, to a gateway of
 * its own in front of its own engine double; what each client got. With a
 * `rate` (bytes/s), the clients that can pace their body do.
 */
export async function runRefusal (
  start: StartGateway,
  refusal: Refusal,
  clients: Readonly<Record<string, Client>>,
  sizes: readonly SizeName[],
  opts: { rate?: number } = {}
): Promise<Run[]> {
  const stub = await startStubUpstream()
  try {
    const gw = await start(stub.url, refusal.gateway ?? {})
    let release: (() => void) | undefined
    try {
      release = await refusal.hold?.(gw.url, stub)
      refusal.engine?.(stub)
      let n = 0
      const runs = sizes.flatMap((size) =>
        Object.entries(clients).map(([client, send]) => {
          const sub = refusal.heldUser === true ? HELD_USER : `user-${n++}`
          const expected = { status: refusal.status, body: refusal.bodyFor?.(size) ?? refusal.body }
          return (async (): Promise<Run> => {
            const outcome = await send(gw.url, { ...refusal.request(SIZES[size], sub), ...opts })
            return { refusal: refusal.name, client, size, outcome, expected }
          })()
        })
      )
      return await Promise.all(runs)
    } finally {
      release?.()
      await gw.close()
    }
  } finally {
    await stub.close()
  }
}

/** The client read exactly the expected answer. */
export function readItsAnswer (run: Run): boolean {
  const { outcome, expected } = run
  if (outcome.status !== expected.status || outcome.body === undefined) return false
  try {
    return JSON.stringify(JSON.parse(outcome.body)) === JSON.stringify(expected.body)
  } catch {
    return false
  }
}
