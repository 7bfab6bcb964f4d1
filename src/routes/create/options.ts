import type { FastifyRequest } from 'fastify'
import type { EngineClient } from '../../engine-client/client.js'
import type { Idempotency } from '../../limits/idempotency.js'
import type { UploadShare, UploadShareOptions } from '../../limits/upload-share.js'
import type { MinRate, MinRateOptions } from './min-rate.js'

export interface CreatePortfolioOptions {
  engine: EngineClient
  idempotency: Idempotency
  /** UPSTREAM_TIMEOUT_MS: from the last byte sent to the engine's response headers. */
  responseTimeoutMs: number
  /** How long the engine may stop reading an upload before the call is given up. */
  stallTimeoutMs: number
  /** Outer bound on the whole engine call, upload included. */
  callTimeoutMs: number
  /** The per-user cap and the uploads' share of engine connections (decision: uploads share the engine fairly). */
  uploads: UploadShareOptions
  /** The minimum-rate rule; tests shorten it. */
  minRate?: MinRateOptions
  /** Told when a create got its upload connection, and since when it asked (decision: traces). */
  uploadWaited?: (request: FastifyRequest, askedAt: number) => void
}

/** What every create of one route shares: its options, the upload share and the minimum-rate ticker. */
export interface CreateRoute extends CreatePortfolioOptions {
  share: UploadShare
  rate: MinRate
}
