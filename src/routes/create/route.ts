/**
 * POST /api/portfolio/create: multipart, validated while it streams to the engine.
 * The parsing and checks are in CreateUpload; this is the wiring.
 */
import fastifyMultipart from '@fastify/multipart'
import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify'
import type { IncomingMessage } from 'node:http'
import { CREATE_BODY_MAX_BYTES, CREATE_FORM_LIMITS } from '../../../schemas/portfolio.js'
import { isEngineCreateResponse } from '../../../schemas/upstream.js'
import { CreateUpload, type SniffedImage } from './upload.js'
import { callerOf, type EngineClient } from '../../engine-client/client.js'
import { validationError } from '../../http/errors.js'
import { awaitingContinue, writeContinue } from '../../http/front.js'
import { watchClientGone, type Abandonment } from '../../http/client-gone.js'
import { assertEngineJson, sendEngineJson } from '../../engine-client/answers.js'
import { CreateExchange } from './exchange.js'
import type { EngineRequest, EngineResponse } from '../../engine-client/types.js'
import { CREATE_ENGINE_ERRORS } from '../openapi-answers.js'
import { isPartAFile } from '../../shared/form-parts.js'
import { fingerprintOf, idempotencyKeyOf, type Idempotency } from '../../limits/idempotency.js'
import { MIN_RATE, MinRate, type MinRateOptions } from './min-rate.js'
import { UploadShare, type UploadShareOptions } from '../../limits/upload-share.js'

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
  /** Fair uploads (DECISIONS 23): per-user cap and the uploads' share of engine connections. */
  uploads: UploadShareOptions
  /** The minimum-rate rule; tests shorten it. */
  minRate?: MinRateOptions
  /** Told when a create got its upload connection, and since when it asked (tracing, DECISIONS 29). */
  uploadWaited?: (request: FastifyRequest, askedAt: number) => void
}

export const createPortfolioRoutes: FastifyPluginAsync<CreatePortfolioOptions> = async (app, opts) => {
  await app.register(fastifyMultipart, {
    // Text parts read as streams (shared/form-parts.ts) count as files to busboy; the image is still taken once.
    limits: { ...CREATE_FORM_LIMITS, files: CREATE_FORM_LIMITS.parts },
    isPartAFile
  })

  const share = new UploadShare(opts.uploads)
  app.addHook('onClose', async () => { share.close() })
  const minRate = new MinRate(opts.minRate ?? MIN_RATE)

  app.post('/create', { config: { handler: 'createPortfolio' } }, async function createPortfolio (request, reply) {
    const { exchange, form, gone } = openExchange(request, reply, share, minRate, opts)
    try {
      const declared = request.headers['content-length']
      if (Number(declared ?? 0) > CREATE_BODY_MAX_BYTES) throw validationError(BODY_TOO_LARGE)
      const key = idempotencyKeyOf(request)
      await exchange.claim()
      const upload = form.open(key !== undefined)
      // A chunked body declares nothing: count it, and stop reading once it passes the bound.
      if (declared === undefined) limitBody(request.raw, CREATE_BODY_MAX_BYTES, upload)
      // The key is claimed before the first byte goes to the engine.
      const answer = await opts.idempotency.run(request, reply, key, {
        // No digest is taken without a key: the image is hashed only then.
        fingerprint: () => fingerprintOf('create', upload.contentDigest()),
        // The upload may take the request's whole time, then the engine's answer its deadline.
        runsForMs: opts.callTimeoutMs,
        readAll: async () => {
          exchange.readWhole()
          await readWholeForm(upload)
        },
        call: async () => await callEngine({ request, exchange, form: upload, key, gone }, opts)
      })
      return answer === undefined ? reply : sendEngineJson(reply, answer)
    } catch (err) {
      // The client's mistake explains a failed engine call better than the failure does.
      throw exchange.fail(form.upload?.refusal ?? err)
    } finally {
      exchange.dispose()
      // An event out of order is a bug of ours that a client can only see as a 500: it is logged with the state.
      for (const { state, event, message } of exchange.illegal) request.log.error({ state, event }, message)
      request.log.debug({ endReason: exchange.endReason }, 'create exchange ended')
    }
  })
}

/** The form, opened once the create holds its place. */
interface LazyForm { upload: CreateUpload | undefined, open: (fingerprint: boolean) => CreateUpload }

/** A create's exchange, wired to its request: the client's hang-ups, its socket and its 100-continue. */
function openExchange (
  request: FastifyRequest, reply: FastifyReply, share: UploadShare, minRate: MinRate, opts: CreatePortfolioOptions
): { exchange: CreateExchange, form: LazyForm, gone: Abandonment } {
  const form: LazyForm = {
    upload: undefined,
    open: (fingerprint) => (form.upload = new CreateUpload(request, { fingerprint }))
  }
  // A client gone once its whole form is in still takes its call out of the queue for an engine connection.
  const gone = watchClientGone(reply)
  const socket = request.raw.socket
  const exchange = new CreateExchange({
    subject: request.userId,
    share,
    minRate,
    responseTimeoutMs: opts.responseTimeoutMs,
    stallTimeoutMs: opts.stallTimeoutMs,
    response: reply.raw,
    cut: (err) => form.upload?.cutOff(err),
    invite: () => { writeContinue(request.raw, reply.raw) },
    received: () => socket.bytesRead,
    slotWaited: (askedAt) => opts.uploadWaited?.(request, askedAt),
    unwatch: () => {
      request.raw.off('close', onClientGone)
      gone.done()
    }
  })
  // A client that leaves mid-upload abandons the engine request too.
  const onClientGone = (): void => { if (!request.raw.complete) exchange.clientLeft() }
  request.raw.once('close', onClientGone)
  return { exchange, form, gone: gone.signal }
}

/** One create's engine call: its request, exchange and form, and the client's hang-up once the form is in. */
interface CreateCall {
  request: FastifyRequest
  exchange: CreateExchange
  form: CreateUpload
  key: string | undefined
  gone: Abandonment
}

/** The engine call: streamed once the image is sniffed, or the whole small form at once. */
async function callEngine (call: CreateCall, opts: CreatePortfolioOptions): Promise<EngineResponse> {
  const { request, exchange, form } = call
  // A client that waits to be invited gets an upload connection before it sends a byte; any other, once its
  // image is sniffed.
  if (awaitingContinue(request.raw)) await exchange.invite()
  exchange.sniff()
  const image = await form.readUntilImage()
  const answer = image === undefined ? await sendWhole(call, opts) : await sendStreamed(call, image, opts)
  if (form.refusal !== undefined) throw form.refusal
  assertEngineJson(answer, (v) => isEngineCreateResponse.Check(v), CREATE_ANSWER, CREATE_ENGINE_ERRORS)
  return answer
}

/** What every engine create carries: the caller, the form's type, the key, the client's hang-up. */
function engineRequestOf ({ request, form, key, gone }: CreateCall): EngineRequest {
  return {
    method: 'POST',
    path: '/api/portfolio/create',
    ...callerOf(request),
    contentType: form.writer.contentType,
    ...(key === undefined ? {} : { idempotencyKey: key }),
    abandonIfQueued: gone
  }
}

/** A form with no image, read whole: it goes in one piece, with nothing to time on the client. */
async function sendWhole (call: CreateCall, opts: CreatePortfolioOptions): Promise<EngineResponse> {
  call.exchange.wholeForm()
  try {
    return await opts.engine.call({ ...engineRequestOf(call), body: call.form.bufferedBody() })
  } finally {
    call.exchange.callOver()
  }
}

/** The image streams to the engine as it arrives, on an upload connection, timed by the exchange. */
async function sendStreamed (
  call: CreateCall, image: SniffedImage, opts: CreatePortfolioOptions
): Promise<EngineResponse> {
  const { exchange, form, key } = call
  await exchange.stream()
  let answer
  try {
    answer = await opts.engine.call({
      ...engineRequestOf(call),
      body: form.streamBody(image, exchange.timing),
      signal: exchange.signal,
      responseTimeoutMs: 0,
      headersTimeoutMs: opts.callTimeoutMs,
      onResponseStart: () => { exchange.responded() }
    })
  } finally {
    exchange.callOver()
  }
  // The fingerprint covers the whole form: an engine that answered mid-upload left the rest unread; it is
  // read and hashed before the record is stored, and a form that cannot be read to its end stores nothing.
  if (key !== undefined) {
    exchange.readRest()
    await form.finishReading()
  }
  return answer
}

const BODY_TOO_LARGE = `body must be at most ${CREATE_BODY_MAX_BYTES} bytes`

/** Read, check and hash the whole form without sending it anywhere (a replay must still be the same form). */
async function readWholeForm (upload: CreateUpload): Promise<void> {
  const image = await upload.readUntilImage()
  if (image === undefined) {
    upload.bufferedBody()
    return
  }
  const idle = { handedOver: () => {}, taken: () => {}, bodySent: () => {}, refused: () => {} }
  const drained = upload.streamBody(image, idle)
  // Drained: validated and hashed, not sent.
  while ((await drained.next()).done !== true);
  if (upload.refusal !== undefined) throw upload.refusal
}

/**
 * Stop feeding the parser once a chunked body grows past `max` bytes, and fail
 * the read in progress: the route answers 400 with `connection: close`. What
 * arrives until the socket closes is discarded, not left unread: closing a
 * socket with unread bytes sends a reset, which can destroy the answer
 * before the client reads it.
 */
function limitBody (raw: IncomingMessage, max: number, upload: CreateUpload): void {
  let seen = 0
  const count = (chunk: Buffer): void => {
    seen += chunk.length
    if (seen <= max) return
    raw.off('data', count)
    raw.unpipe()
    raw.resume()
    upload.cutOff(validationError(BODY_TOO_LARGE))
  }
  raw.on('data', count)
  // A 'data' listener starts the body flowing, but the form parser is piped
  // only once the engine call begins, after the Idempotency-Key claim (a round
  // trip to Redis): bytes that flowed before it would be lost. Paused, they
  // wait; the parser's pipe resumes the stream, and both then see every chunk.
  raw.pause()
}
