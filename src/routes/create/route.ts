/** POST /api/portfolio/create: multipart, validated while it streams to the engine, one exchange per request. */
import fastifyMultipart from '@fastify/multipart'
import type { FastifyPluginAsync } from 'fastify'
import { CREATE_FORM_LIMITS } from '../../../schemas/portfolio.js'
import { isPartAFile } from '../../shared/form-parts.js'
import { UploadShare } from '../../limits/upload-share.js'
import { MIN_RATE, MinRate } from './min-rate.js'
import type { CreatePortfolioOptions, CreateRoute } from './options.js'
import { runCreate } from './run.js'

export const createPortfolioRoutes: FastifyPluginAsync<CreatePortfolioOptions> = async (app, opts) => {
  await app.register(fastifyMultipart, {
    // Text parts read as streams count as files to busboy; the image is still taken once.
    limits: { ...CREATE_FORM_LIMITS, files: CREATE_FORM_LIMITS.parts },
    isPartAFile
  })
  const share = new UploadShare(opts.uploads)
  const route: CreateRoute = { ...opts, share, rate: new MinRate(opts.minRate ?? MIN_RATE) }
  app.addHook('onClose', async () => { share.close() })
  app.post('/create', { config: { handler: 'createPortfolio' } }, async function createPortfolio (request, reply) {
    return await runCreate(request, reply, route)
  })
}
