/** Rules across positions that JSON Schema cannot say (decision: allocations). */
import { LIMITS, type TargetPosition } from '../../schemas/portfolio.js'

export function targetPositionsProblem (positions: readonly TargetPosition[]): string | undefined {
  const seen = new Map<string, number>()
  let sum = 0
  for (let i = 0; i < positions.length; i++) {
    const { mint, allocation } = positions[i]!
    const first = seen.get(mint)
    if (first !== undefined) return `target_positions[${i}].mint repeats target_positions[${first}].mint`
    seen.set(mint, i)
    sum += allocation
  }
  if (Math.abs(sum - 1) > LIMITS.allocationSumTolerance) {
    return `target_positions allocations must sum to 1 (they sum to ${Number(sum.toPrecision(12))})`
  }
  return undefined
}
