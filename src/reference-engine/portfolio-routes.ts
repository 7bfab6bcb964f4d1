/**
 * The engine's portfolio routes (decision: upstream contract). Each names its handler in `config.handler` for the
 * structured error's `function`: Fastify binds handlers, so their own names read "bound ...".
 */
import { randomUUID } from 'node:crypto'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import {
  CREATE_FORM_LIMITS,
  IMAGE_FIELD,
  type CreatePortfolioFields,
  type CreatePortfolioResponse,
  type UpdatePortfolioResponse
} from '../../schemas/portfolio.js'
import { USER_ID_HEADER } from '../../schemas/upstream.js'
import { EngineError, KEY_REUSED_MESSAGE, StoreUnavailableError, validationError } from './errors.js'
import {
  discardFile,
  NO_IMAGE_SHA256,
  receiveImage,
  storeImage,
  type ReceivedImage,
  type StoredImage
} from './images.js'
import { isMalformedMultipart } from '../shared/multipart-errors.js'
import { shownName } from '../shared/validation-messages.js'
import { PART_WITHOUT_NAME, readTextPart } from '../shared/form-parts.js'
import type { KeyRecord, Portfolio, PortfolioStore } from './store.js'
import { fingerprintOf, formContent } from '../shared/fingerprint.js'
import { parseCreateFields, parseUpdateBody } from './validation.js'

export interface PortfolioRoutesOptions {
  store: PortfolioStore
  imageDir: string
}

/** The gateway names the user in x-user-id; without it the engine serves nobody (decision: identity). */
export function requireUserId (request: FastifyRequest): string {
  const value = request.headers[USER_ID_HEADER]
  if (typeof value !== 'string' || value.trim() === '') {
    throw new EngineError('UNAUTHORIZED', `${USER_ID_HEADER} header is required`)
  }
  return value
}

function idempotencyKey (request: FastifyRequest): string | undefined {
  const value = request.headers['idempotency-key']
  return typeof value === 'string' && value !== '' ? value : undefined
}

export async function portfolioRoutes (app: FastifyInstance, opts: PortfolioRoutesOptions): Promise<void> {
  const { store, imageDir } = opts

  // onRequest, not preHandler: an unauthenticated upload is refused before its body is read.
  app.addHook('onRequest', async (request) => {
    requireUserId(request)
  })

  app.get(
    '/api/portfolio/ping',
    { config: { handler: 'pingPortfolio' } },
    async function pingPortfolio (_request, reply) {
      return reply.type('text/plain; charset=utf-8').send('pong')
    }
  )

  app.post(
    '/api/portfolio/create',
    { config: { handler: 'createPortfolio' } },
    async function createPortfolio (request): Promise<CreatePortfolioResponse> {
      const create: Create = { owner: requireUserId(request), key: idempotencyKey(request), leftovers: [] }
      try {
        const form = await readCreateForm(request, imageDir, create.leftovers)
        return await recordPortfolio(request, store, imageDir, create, form)
      } catch (err) {
        await Promise.all(create.leftovers.map(discardFile))
        throw malformedMultipart(err)
      }
    }
  )

  app.post(
    '/api/portfolio/update',
    { config: { handler: 'updatePortfolio' } },
    async function updatePortfolio (request): Promise<UpdatePortfolioResponse> {
      const owner = requireUserId(request)
      const body = parseUpdateBody(request)
      if (!(await store.replaceTargets(body.portfolio_id, owner, body.target_positions))) {
        // Unknown and foreign ids answer the same, so ids cannot be probed (decision: unknown portfolio).
        throw new EngineError('NOT_FOUND', 'portfolio_id does not name a portfolio of this user')
      }
      return { success: true, message: 'Target positions updated' }
    }
  )
}

interface Create {
  owner: string
  key: string | undefined
  /** Files to delete if anything fails; emptied once the portfolio is recorded. */
  leftovers: string[]
}

interface CreateForm {
  fields: Map<string, string>
  received: ReceivedImage | undefined
}

/** Reads every part of the create form; the image goes to a temporary file, listed in `leftovers`. */
async function readCreateForm (request: FastifyRequest, imageDir: string, leftovers: string[]): Promise<CreateForm> {
  const fields = new Map<string, string>()
  let received: ReceivedImage | undefined
  for await (const part of request.parts()) {
    if (part.fieldname === undefined || part.fieldname === '') {
      if (part.type === 'file') part.file.resume()
      throw validationError(PART_WITHOUT_NAME)
    }
    if (part.type === 'file' && part.filename === undefined && part.fieldname !== IMAGE_FIELD) {
      // A text part declared as JSON, read as the text it is (shared/form-parts.ts).
      const text = await readTextPart(part.file, CREATE_FORM_LIMITS.fieldSize)
      if (text.truncated) throw validationError(`${part.fieldname} is too long`)
      if (fields.has(part.fieldname)) throw validationError(`${part.fieldname} must appear only once`)
      fields.set(part.fieldname, text.value)
      continue
    }
    if (part.type === 'file') {
      if (part.fieldname !== IMAGE_FIELD) {
        part.file.resume()
        throw validationError(`${shownName(part.fieldname)} is not an accepted file field (only ${IMAGE_FIELD})`)
      }
      if (received !== undefined) {
        part.file.resume()
        throw validationError(`${IMAGE_FIELD} must be given once`)
      }
      received = await receiveImage(part, imageDir, CREATE_FORM_LIMITS.fileSize)
      leftovers.push(received.tempPath)
      continue
    }
    const name = part.fieldname
    if (name === IMAGE_FIELD) throw validationError(`${IMAGE_FIELD} must be a file`)
    if (part.valueTruncated) {
      throw validationError(`${shownName(name)} is longer than ` +
      `${CREATE_FORM_LIMITS.fieldSize} bytes`)
    }
    if (typeof part.value !== 'string') throw validationError(`${shownName(name)} must be a plain text field`)
    if (fields.has(name)) throw validationError(`${shownName(name)} must be given once`)
    fields.set(name, part.value)
  }
  // The loop ends only once busboy has seen the end of the body; a client that hangs up earlier makes it throw
  // (test/reference-engine/abort.test.ts holds @fastify/multipart to that).
  return { fields, received }
}

/** Stores the portfolio of a complete, valid form, or answers the one an earlier create with its key made. */
async function recordPortfolio (
  request: FastifyRequest, store: PortfolioStore, imageDir: string, create: Create, form: CreateForm
): Promise<CreatePortfolioResponse> {
  const { owner, key, leftovers } = create
  const valid = parseCreateFields(request, Object.fromEntries(form.fields))
  // A repeated key with the same form answers the portfolio it created, with another form a 422 (decision:
  // idempotency).
  const fingerprint =
    key === undefined ? '' : fingerprintOf('create', formContent(form.fields, form.received?.sha256 ?? NO_IMAGE_SHA256))
  const prior = key === undefined ? undefined : await store.createdWithKey(owner, key)
  if (prior !== undefined) {
    await Promise.all(leftovers.map(discardFile))
    return repeated(request, prior, fingerprint)
  }
  const id = randomUUID()
  let image: StoredImage | undefined
  if (form.received !== undefined) {
    image = await storeImage(form.received, imageDir, id)
    leftovers.push(image.path)
  }
  const portfolio = newPortfolio(id, owner, valid, image)
  // Another create with this key may have finished while this image was stored.
  let stored: KeyRecord | undefined
  try {
    if (key === undefined) await store.insert(portfolio)
    else stored = await store.insertOnce(portfolio, key, fingerprint)
  } catch (err) {
    // A timed-out store may have written the record that names the image: an orphan file is harmless, a record
    // without its image is not.
    if (err instanceof StoreUnavailableError && err.maybeWritten && image !== undefined) {
      leftovers.splice(leftovers.indexOf(image.path), 1)
    }
    throw err
  }
  if (stored !== undefined && stored.portfolioId !== id) {
    await Promise.all(leftovers.map(discardFile))
    return repeated(request, stored, fingerprint)
  }
  leftovers.length = 0
  request.log.info({ portfolioId: id, image: image?.bytes }, 'portfolio created')
  return { portfolio_id: id }
}

function newPortfolio (
  id: string, owner: string, valid: CreatePortfolioFields, image: StoredImage | undefined
): Portfolio {
  return {
    id,
    owner,
    name: valid.name,
    type: valid.type,
    ...(valid.beneficiary_wallet === undefined ? {} : { beneficiary_wallet: valid.beneficiary_wallet }),
    ...(valid.description === undefined ? {} : { description: valid.description }),
    ...(image === undefined ? {} : { image }),
    status: 'DRAFT',
    positions: [],
    target_positions: []
  }
}

/** The answer to a create whose owner and key already made a portfolio: that one, if the form is the same. */
function repeated (request: FastifyRequest, prior: KeyRecord, fingerprint: string): CreatePortfolioResponse {
  if (prior.fingerprint !== undefined && prior.fingerprint !== fingerprint) {
    request.log.info(
      { portfolioId: prior.portfolioId },
      'portfolio create refused: idempotency key used for a different form'
    )
    throw new EngineError('IDEMPOTENCY_KEY_REUSED', KEY_REUSED_MESSAGE)
  }
  request.log.info({ portfolioId: prior.portfolioId }, 'portfolio create repeated with its idempotency key')
  return { portfolio_id: prior.portfolioId }
}

function malformedMultipart (err: unknown): unknown {
  return isMalformedMultipart(err) ? validationError(`multipart body is malformed: ${err.message}`, err) : err
}
