/** Health and connectivity bodies (spec "Endpoints"; DECISIONS 11-12). */
import { Type, type Static } from '@sinclair/typebox'

export const Liveness = Type.Object({
  status: Type.String(),
  timestamp: Type.String({ format: 'date-time' }),
  /** Seconds since the process started (the spec leaves the unit open; we pick seconds). */
  uptime: Type.Number()
}, { $id: 'Liveness' })
export type Liveness = Static<typeof Liveness>

export const Pong = Type.Object({ message: Type.Literal('pong') }, { $id: 'Pong' })

export const ApiHealth = Type.Object({
  status: Type.Union([Type.Literal('ok'), Type.Literal('degraded')]),
  timestamp: Type.String({ format: 'date-time' }),
  services: Type.Object({
    database: Type.String(),
    cache: Type.String()
  })
}, { $id: 'ApiHealth' })
export type ApiHealth = Static<typeof ApiHealth>
