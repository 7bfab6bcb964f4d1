/** The client contract for portfolios (spec "Resources", "Endpoints", "Limits"), read by routes, engine and docs. */
import { Type, type Static } from '@sinclair/typebox'
import { SOLANA_ADDRESS_FORMAT } from './formats.js'

export const LIMITS = Object.freeze({
  nameMin: 1,
  nameMax: 30,
  descriptionMax: 500,
  walletMin: 32,
  walletMax: 44,
  /** "10MB" is 10 MiB (decision: image). */
  imageMaxBytes: 10 * 1024 * 1024,
  targetPositionsMin: 1,
  targetPositionsMax: 100,
  /** Floating-point error allowed in the allocation sum (decision: allocations). */
  allocationSumTolerance: 1e-9,
  /** 100 positions of two 44-char fields fit in ~10 KiB; anything far larger is not an update. */
  updateBodyMaxBytes: 64 * 1024
})

export const SolanaAddress = Type.String({
  format: SOLANA_ADDRESS_FORMAT,
  minLength: LIMITS.walletMin,
  maxLength: LIMITS.walletMax
})

export const PortfolioType = Type.Union([Type.Literal('PORTFOLIO'), Type.Literal('INDEX_PORTFOLIO')])
export type PortfolioType = Static<typeof PortfolioType>

/** Visible ASCII, no spaces or control characters: safe for an engine to use in a path or a key. */
export const PRINTABLE_ASCII = '^[\\x21-\\x7e]+$'

/** A missing, empty or non-string id is 400 (decision: unknown portfolio). */
export const PortfolioId = Type.String({ minLength: 1, maxLength: 128, pattern: PRINTABLE_ASCII })

export const TargetPosition = Type.Object(
  {
    mint: SolanaAddress,
    allocation: Type.Number({ minimum: 0, maximum: 1 })
  },
  { additionalProperties: false }
)
export type TargetPosition = Static<typeof TargetPosition>

export const UpdatePortfolioBody = Type.Object(
  {
    portfolio_id: PortfolioId,
    target_positions: Type.Array(TargetPosition, {
      minItems: LIMITS.targetPositionsMin,
      maxItems: LIMITS.targetPositionsMax
    })
  },
  { $id: 'UpdatePortfolioBody', additionalProperties: false }
)
export type UpdatePortfolioBody = Static<typeof UpdatePortfolioBody>

export const UpdatePortfolioResponse = Type.Object(
  {
    success: Type.Literal(true),
    message: Type.String()
  },
  { $id: 'UpdatePortfolioResponse', additionalProperties: false }
)
export type UpdatePortfolioResponse = Static<typeof UpdatePortfolioResponse>

/** The text fields of the create form (the image is a file part, checked as it streams). */
export const CreatePortfolioFields = Type.Object(
  {
    name: Type.String({ minLength: LIMITS.nameMin, maxLength: LIMITS.nameMax }),
    type: PortfolioType,
    beneficiary_wallet: Type.Optional(SolanaAddress),
    description: Type.Optional(Type.String({ maxLength: LIMITS.descriptionMax }))
  },
  { additionalProperties: false }
)
export type CreatePortfolioFields = Static<typeof CreatePortfolioFields>

/** Checked as each field arrives, before the next part is read. */
export const CreatePortfolioField = Type.Partial(CreatePortfolioFields, { additionalProperties: false })

/** busboy drops preamble and epilogue bytes without limit, so the whole request needs one. */
export const CREATE_BODY_MAX_BYTES = LIMITS.imageMaxBytes + 64 * 1024

export const IMAGE_FIELD = 'image'

/** busboy's names; each breach is a 400 naming it. */
export const CREATE_FORM_LIMITS = Object.freeze({
  /** Bytes: 500 characters of UTF-8 take at most 2000. */
  fieldSize: 2048,
  fields: 4,
  files: 1,
  parts: 5,
  fileSize: LIMITS.imageMaxBytes,
  /** Per part; busboy skips the rest unread, with no error for it. */
  headerPairs: 16,
  headerSize: 1024
})

export const CreatePortfolioResponse = Type.Object(
  {
    portfolio_id: Type.String({ minLength: 1 })
  },
  { $id: 'CreatePortfolioResponse', additionalProperties: false }
)
export type CreatePortfolioResponse = Static<typeof CreatePortfolioResponse>
