/** A create's engine call: the whole small form at once, or the image streamed as it arrives. */
import type { FastifyRequest } from 'fastify'
import { isEngineCreateResponse } from '../../../schemas/upstream.js'
import { assertEngineJson } from '../../engine-client/answers.js'
import { callerOf } from '../../engine-client/client.js'
import type { EngineRequest, EngineResponse } from '../../engine-client/types.js'
import type { Abandonment } from '../../http/client-gone.js'
import { awaitingContinue } from '../../http/front.js'
import { CREATE_ENGINE_ERRORS } from '../openapi-answers.js'
import type { CreateExchange } from './exchange.js'
import type { CreatePortfolioOptions } from './options.js'
import type { CreateUpload, SniffedImage } from './upload.js'

const CREATE_ANSWER = '200 { portfolio_id }'

/** One create's engine call: its request, exchange and form, and the client's hang-up once the form is in. */
export interface CreateCall {
  request: FastifyRequest
  exchange: CreateExchange
  form: CreateUpload
  key: string | undefined
  gone: Abandonment
}

export async function callEngine (call: CreateCall, opts: CreatePortfolioOptions): Promise<EngineResponse> {
  const { request, exchange, form } = call
  // An invited client gets its upload connection before it sends a byte; any other, once its image is sniffed.
  if (awaitingContinue(request.raw)) await exchange.invite()
  exchange.sniff()
  const image = await form.readUntilImage()
  const answer = image === undefined ? await sendWhole(call, opts) : await sendStreamed(call, image, opts)
  if (form.refusal !== undefined) throw form.refusal
  assertEngineJson(answer, (v) => isEngineCreateResponse.Check(v), CREATE_ANSWER, CREATE_ENGINE_ERRORS)
  return answer
}

function engineRequestOf ({ request, form, key, gone }: CreateCall): Extract<EngineRequest, { method: 'POST' }> {
  return {
    method: 'POST',
    path: '/api/portfolio/create',
    ...callerOf(request),
    contentType: form.writer.contentType,
    ...(key === undefined ? {} : { idempotencyKey: key }),
    abandonIfQueued: gone
  }
}

async function sendWhole (call: CreateCall, opts: CreatePortfolioOptions): Promise<EngineResponse> {
  call.exchange.wholeForm()
  try {
    return await opts.engine.call({ ...engineRequestOf(call), body: call.form.bufferedBody() })
  } finally {
    call.exchange.callOver()
  }
}

async function sendStreamed (
  call: CreateCall, image: SniffedImage, opts: CreatePortfolioOptions
): Promise<EngineResponse> {
  const { exchange, form, key } = call
  await exchange.stream()
  let answer
  try {
    answer = await opts.engine.call({
      ...engineRequestOf(call),
      body: form.streamBody(image, exchange),
      signal: exchange.signal,
      // The exchange's clock times a streamed call, not undici's socket-activity timers.
      responseTimeoutMs: 0,
      headersTimeoutMs: opts.callTimeoutMs,
      onResponseStart: () => { exchange.responded() }
    })
  } finally {
    exchange.callOver()
  }
  // A keyed form's fingerprint covers all of it: what an early answer left unread is read and hashed now.
  if (key !== undefined) {
    exchange.readRest()
    await form.finishReading()
  }
  return answer
}
