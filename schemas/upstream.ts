/** What the engine must answer (docs/decisions/upstream-contract.md); anything else becomes a 502. */
import { Type, type Static } from '@sinclair/typebox'
import { TypeCompiler } from '@sinclair/typebox/compiler'
import { StructuredError } from './errors.js'
import { CreatePortfolioResponse, UpdatePortfolioResponse } from './portfolio.js'

export const EngineHealth = Type.Object({
  status: Type.String(),
  services: Type.Object({
    database: Type.String(),
    cache: Type.String()
  })
})
export type EngineHealth = Static<typeof EngineHealth>

/** Headers every engine call carries (decisions: identity; request ids). */
export const USER_ID_HEADER = 'x-user-id'
export const REQUEST_ID_HEADER = 'x-request-id'

/** What a connected service reports in the engine's health answer. */
export const SERVICE_CONNECTED = 'connected'

export const isEngineHealth = TypeCompiler.Compile(EngineHealth)
export const isEngineError = TypeCompiler.Compile(StructuredError)
export const isEngineCreateResponse = TypeCompiler.Compile(CreatePortfolioResponse)
export const isEngineUpdateResponse = TypeCompiler.Compile(UpdatePortfolioResponse)
