/**
 * POST /api/portfolio/create: multipart, validated while it streams to the engine.
 * The parsing and checks are in CreateUpload; this is the wiring.
 */
import fastifyMultipart from '@fastify/multipart'
import type { FastifyPluginAsync, FastifyRequest } from 'fastify'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { CREATE_BODY_MAX_BYTES, CREATE_FORM_LIMITS } from '../../../schemas/portfolio.js'
import { isEngineCreateResponse } from '../../../schemas/upstream.js'
import { CreateUpload } from './upload.js'
import { callerOf, type EngineClient } from '../../engine-client/client.js'
import { GatewayError, validationError } from '../../http/errors.js'
import { awaitingContinue, writeContinue } from '../../http/front.js'
import { watchClientGone } from '../../http/client-gone.js'
import { assertEngineJson, sendEngineJson } from '../../engine-client/answers.js'
import { CREATE_ENGINE_ERRORS } from '../openapi-answers.js'
import { UploadClock } from './upload-clock.js'
import { isPartAFile } from '../../shared/form-parts.js'
import { fingerprintOf, idempotencyKeyOf, type Idempotency } from '../../limits/idempotency.js'
import { MIN_RATE, MinRate, type MinRateOptions } from './min-rate.js'
import { UploadShare, type UploadShareOptions } from './upload-share.js'

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
    // Text parts read as streams (shared/form-parts.ts) count as files to busboy; the image is still taken once, by name.
    limits: { ...CREATE_FORM_LIMITS, files: CREATE_FORM_LIMITS.parts },
    isPartAFile
  })

  const share = new UploadShare(opts.uploads)
  app.addHook('onClose', async () => { share.close() })
  const minRate = new MinRate(opts.minRate ?? MIN_RATE)

  app.post('/create', { config: { handler: 'createPortfolio' } }, async function createPortfolio (request, reply) {
    let upload: CreateUpload | undefined
    // A client too slow while it holds an engine connection: its reads fail with the 408 (the engine call is aborted by the clock).
    const clock = new UploadClock(opts.responseTimeoutMs, opts.stallTimeoutMs, { watch: minRate, cut: (err) => upload?.cutOff(err) })
    // A client that leaves mid-upload abandons the engine request too (DECISIONS 22).
    const onClientGone = (): void => { if (!request.raw.complete) clock.abort(clientWentAway()) }
    request.raw.once('close', onClientGone)
    // A client gone once its whole form is in (the above cannot tell) still takes its call out of the
    // queue for an engine connection; a call already being written goes on (abandonIfQueued).
    const gone = watchClientGone(reply)
    // Expect: 100-continue: the body is invited only once the create will really stream (DECISIONS 21 v4).
    const invites = awaitingContinue(request.raw)
    let connection: (() => void) | undefined
    const place = new Place(reply.raw)
    try {
      // Refused before any of the body is read.
      const declared = request.headers['content-length']
      if (Number(declared ?? 0) > CREATE_BODY_MAX_BYTES) throw validationError(BODY_TOO_LARGE)
      const key = idempotencyKeyOf(request)
      // DECISIONS 23: a third create of the same user is refused before it can open an engine request.
      // Its place is given back once the handler has settled (its engine call is over) and the answer
      // is sent: not when a lingering read of the rest ends, and not when a client that sent its whole
      // form hangs up while the engine still has its upload.
      place.leave = await share.enter(request.userId)
      reply.raw.once('finish', place.sent).once('close', place.sent)
      const form = upload = new CreateUpload(request, { fingerprint: key !== undefined })
      // A chunked body declares nothing: count it, and stop reading once it passes the bound.
      if (declared === undefined) limitBody(request.raw, CREATE_BODY_MAX_BYTES, form)
      const invite = (): void => { writeContinue(request.raw, reply.raw) }
      // DECISIONS 16: the key is claimed before the first byte goes to the engine.
      const answer = await opts.idempotency.run(request, reply, key, {
        // No digest is taken without a key: the image is hashed only then.
        fingerprint: () => fingerprintOf('create', form.contentDigest()),
        // The upload may take the request's whole time, then the engine's answer its deadline.
        runsForMs: opts.callTimeoutMs,
        readAll: async () => {
          invite()
          await readWholeForm(form)
        },
        call: async () => {
          // DECISIONS 23: an upload connection, in turn; the wait counts against UPSTREAM_TIMEOUT_MS (DECISIONS 8).
          // A client that waits to be invited gets one before it sends a byte; any other, once its image is sniffed.
          const asked = performance.now()
          // How long the create waited for its upload connection: it counts against UPSTREAM_TIMEOUT_MS.
          let waited = 0
          if (invites) {
            connection = await share.acquire(opts.responseTimeoutMs, clock.signal)
            waited = performance.now() - asked
            opts.uploadWaited?.(request, asked)
            invite()
            // The connection is held from the invitation: a client silent (or trickling) after it is cut off with 408.
            const socket = request.raw.socket
            clock.invited(() => socket.bytesRead)
          }
          const image = await form.readUntilImage()
          const engineRequest = {
            method: 'POST' as const,
            path: '/api/portfolio/create',
            ...callerOf(request),
            contentType: form.writer.contentType,
            ...(key === undefined ? {} : { idempotencyKey: key }),
            abandonIfQueued: gone.signal
          }
          let answer
          if (image === undefined) {
            // The whole form is in: nothing more to time on the client.
            clock.stop()
            connection?.()
            answer = await opts.engine.call({ ...engineRequest, body: form.bufferedBody() })
          } else {
            if (connection === undefined) {
              connection = await share.acquire(opts.responseTimeoutMs, clock.signal)
              waited = performance.now() - asked
              opts.uploadWaited?.(request, asked)
            }
            try {
              clock.queued(Math.max(1, opts.responseTimeoutMs - waited))
              answer = await opts.engine.call({
                ...engineRequest,
                body: form.streamBody(image, clock),
                signal: clock.signal,
                responseTimeoutMs: 0,
                headersTimeoutMs: opts.callTimeoutMs,
                onResponseStart: () => clock.responded()
              })
            } finally {
              connection()
            }
            // DECISIONS 16: the fingerprint covers the whole form. An engine that answered
            // mid-upload left the rest unread: read and hash it (the client sends it anyway)
            // before the record is stored; a form that cannot be read to its end stores nothing.
            if (key !== undefined) {
              const socket = request.raw.socket
              clock.readingRest(() => socket.bytesRead)
              await form.finishReading()
            }
          }
          if (form.refusal !== undefined) throw form.refusal
          assertEngineJson(answer, (v) => isEngineCreateResponse.Check(v), CREATE_ANSWER, CREATE_ENGINE_ERRORS)
          return answer
        }
      })
      return answer === undefined ? reply : sendEngineJson(reply, answer)
    } catch (err) {
      // The client's mistake explains a failed engine call better than the failure does.
      const refusal = upload?.refusal ?? err
      // Whatever refused the create, its engine request (if one is under way) is abandoned:
      // the refusal is the abort's reason, so the try is the client's, never the engine's.
      if (refusal instanceof GatewayError) clock.abort(refusal)
      throw refusal
    } finally {
      // An upload connection is given back with the answer at the latest (release is once).
      connection?.()
      place.settled()
      clock.stop()
      request.raw.off('close', onClientGone)
      gone.done()
    }
  })
}

/** A create's place under the per-user cap: given back once both its handler has settled and its answer is out. */
class Place {
  leave: (() => void) | undefined
  #settled = false
  #sent = false
  readonly #response: ServerResponse

  constructor (response: ServerResponse) {
    this.#response = response
  }

  readonly sent = (): void => {
    this.#sent = true
    this.#release()
  }

  settled (): void {
    this.#settled = true
    // An answer written before the handler settled, or a socket already gone, fires no event now.
    if (this.#response.writableFinished || this.#response.destroyed) this.#sent = true
    this.#release()
  }

  #release (): void {
    if (this.#settled && this.#sent) this.leave?.()
  }
}

/** The reason an engine request is aborted when its client left mid-upload: nobody reads the answer. */
function clientWentAway (): GatewayError {
  return validationError('the client went away before the form was complete')
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
  for await (const _ of upload.streamBody(image, idle)) { /* drained: validated and hashed, not sent */ }
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
