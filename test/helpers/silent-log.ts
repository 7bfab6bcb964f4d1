import type { FastifyBaseLogger } from 'fastify'
import { pino } from 'pino'

/** A logger that writes nothing, for stores and limits a test builds outside an app. */
export const silent: FastifyBaseLogger = pino({ level: 'silent' })
