/**
 * POST /api/portfolio/create: multipart, validated while it streams to the engine.
 * The parsing and checks are in CreateUpload; this is the wiring.
 */
import fastifyMultipart from '@fastify/multipart'
import type { FastifyPluginAsync } from 'fastify'
import type { IncomingMessage } from 'node:http'
import { CREATE_BODY_MAX_BYTES, CREATE_FORM_LIMITS } from '../../../schemas/portfolio.js'
import { isEngineCreateResponse } from '../../../schemas/upstream.js'
import { CreateUpload } from './upload.js'
import type { EngineClient } from '../../engine-client/client.js'
import { validationError } from '../../http/errors.js'
import { assertEngineJson, sendEngineJson } from '../../engine-client/answers.js'
import { UploadClock } from './upload-clock.js'
import { fingerprintOf, idempotencyKeyOf, type Claim, type Idempotency } from '../../limits/idempotency.js'

const CREATE_ANSWER = '200 { portfolio_id }'

export interface CreatePortfolioOptions {
  engine: EngineClient
  idempotency: Idempotency
  /** UPSTREAM_TIMEOUT_MS: from the last byte sent to the engine's response headers. */
  responseTimeoutMs: number
  /** How long the engine may stop reading an upload before the call is given up. */
  stallTimeoutMs: number
  /** Outer bound on the whole engine call, upload included. */
  callTimeoutMs: number
}

export const createPortfolioRoutes: FastifyPluginAsync<CreatePortfolioOptions> = async (app, opts) => {
  await app.register(fastifyMultipart, { limits: CREATE_FORM_LIMITS })

  app.post('/create', { config: { handler: 'createPortfolio' } }, async function createPortfolio (request, reply) {
    const clock = new UploadClock(opts.responseTimeoutMs, opts.stallTimeoutMs)
    let claim: Claim | undefined
    try {
      // Refused before any of the body is read.
      const declared = request.headers['content-length']
      if (Number(declared ?? 0) > CREATE_BODY_MAX_BYTES) throw validationError(`body must be at most ${CREATE_BODY_MAX_BYTES} bytes`)
      // A chunked body declares nothing: count it, and hang up once it passes the bound.
      if (declared === undefined) limitBody(request.raw, CREATE_BODY_MAX_BYTES)
      const upload = new CreateUpload(request)
      // DECISIONS 16: claim the key before the first byte goes to the engine.
      const key = idempotencyKeyOf(request)
      if (key !== undefined) {
        const begun = await opts.idempotency.begin(request, key)
        if ('held' in begun) {
          if (begun.held.state === 'pending') return opts.idempotency.answerHeld(reply, begun.held, '')
          // A completed record: read and check the whole form, never forward it.
          await readWholeForm(upload)
          return opts.idempotency.answerHeld(reply, begun.held, fingerprintOf('create', upload.contentDigest()))
        }
        claim = begun.claim
      }
      const image = await upload.readUntilImage()
      const answer = await opts.engine.call({
        method: 'POST',
        path: '/api/portfolio/create',
        requestId: request.id,
        userId: request.userId,
        contentType: upload.writer.contentType,
        ...(key === undefined ? {} : { idempotencyKey: key }),
        ...(image === undefined
          ? { body: upload.bufferedBody() }
          : { body: upload.streamBody(image, clock), signal: clock.signal, responseTimeoutMs: 0, headersTimeoutMs: opts.callTimeoutMs })
      })
      const isAgreed = (v: unknown): boolean => isEngineCreateResponse.Check(v)
      // The record is stored before the client can see the answer and retry.
      if (claim !== undefined) {
        assertEngineJson(answer, isAgreed, CREATE_ANSWER)
        await claim.complete(fingerprintOf('create', upload.contentDigest()), answer)
      }
      return sendEngineJson(reply, answer, isAgreed, CREATE_ANSWER)
    } catch (err) {
      await claim?.release()
      // Stop reading a body we have refused: close the connection after the answer.
      if (!request.raw.complete) reply.header('connection', 'close')
      throw err
    } finally {
      clock.stop()
    }
  })
}

/** Read, check and hash the whole form without sending it anywhere. */
async function readWholeForm (upload: CreateUpload): Promise<void> {
  const image = await upload.readUntilImage()
  if (image === undefined) {
    upload.bufferedBody()
    return
  }
  const idle = { handedOver: () => {}, taken: () => {}, bodySent: () => {} }
  for await (const _ of upload.streamBody(image, idle)) { /* drained: validated and hashed, not sent */ }
}

/** Destroy a request whose body grows past `max` bytes: the parse fails and the engine call is aborted. */
function limitBody (raw: IncomingMessage, max: number): void {
  let seen = 0
  raw.on('data', (chunk: Buffer) => {
    seen += chunk.length
    if (seen > max) raw.destroy()
  })
}
