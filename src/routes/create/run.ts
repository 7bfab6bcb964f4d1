/** One create request: its exchange wired to the client, its key claimed, then the engine call or a replay. */
import type { FastifyReply, FastifyRequest } from 'fastify'
import { CREATE_BODY_MAX_BYTES } from '../../../schemas/portfolio.js'
import { sendEngineJson } from '../../engine-client/answers.js'
import { validationError } from '../../http/errors.js'
import { writeContinue } from '../../http/front.js'
import { watchClientGone, type Abandonment } from '../../http/client-gone.js'
import { fingerprintOf, idempotencyKeyOf } from '../../limits/idempotency.js'
import { callEngine } from './engine-call.js'
import { CreateExchange } from './exchange.js'
import { BODY_TOO_LARGE, limitBody, readWholeForm } from './form-steps.js'
import type { CreateRoute } from './options.js'
import { CreateUpload } from './upload.js'

export async function runCreate (request: FastifyRequest, reply: FastifyReply, route: CreateRoute): Promise<unknown> {
  const { exchange, form, gone } = openExchange(request, reply, route)
  try {
    const declared = request.headers['content-length']
    if (Number(declared ?? 0) > CREATE_BODY_MAX_BYTES) throw validationError(BODY_TOO_LARGE)
    const key = idempotencyKeyOf(request)
    await exchange.claim()
    const upload = form.open(key !== undefined)
    if (declared === undefined) limitBody(request.raw, CREATE_BODY_MAX_BYTES, upload, (err) => exchange.refused(err))
    // The key is claimed before the first byte goes to the engine.
    const answer = await route.idempotency.run(request, reply, key, {
      // Without a key no digest is taken: hashing the image costs milliseconds.
      fingerprint: () => fingerprintOf('create', upload.contentDigest()),
      // The upload may take the request's whole time, then the engine's answer its deadline.
      runsForMs: route.callTimeoutMs,
      readAll: async () => {
        exchange.readWhole()
        await readWholeForm(upload)
      },
      call: async () => await callEngine({ request, exchange, form: upload, key, gone }, route)
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
}

/** The form, opened once the create holds its place. */
interface LazyForm { upload: CreateUpload | undefined, open: (fingerprint: boolean) => CreateUpload }

/** A create's exchange, wired to its request: the client's hang-ups, its socket and its 100-continue. */
function openExchange (
  request: FastifyRequest, reply: FastifyReply, route: CreateRoute
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
    share: route.share,
    minRate: route.rate,
    responseTimeoutMs: route.responseTimeoutMs,
    stallTimeoutMs: route.stallTimeoutMs,
    response: reply.raw,
    cut: (err) => form.upload?.cutOff(err),
    invite: () => { writeContinue(request.raw, reply.raw) },
    received: () => socket.bytesRead,
    slotWaited: (askedAt) => route.uploadWaited?.(request, askedAt),
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
