/** Health and connectivity bodies (spec "Endpoints"; decisions: api health; liveness). */
import { Type, type Static } from '@sinclair/typebox'

export const Liveness = Type.Object({
  status: Type.String(),
  timestamp: Type.String({ format: 'date-time' }),
  /** Seconds: the spec leaves the unit open. */
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
