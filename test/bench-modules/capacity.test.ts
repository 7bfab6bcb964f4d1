/**
 * The latency pair's capacity (bench/costs.ts): the highest offered rate
 * the everything-on gateway answered in full in the open loop. A step that
 * shed (503), left requests unsent or fell behind its offer is not a
 * capacity, however many 2xx it answered.
 */
import t from 'tap'
import { capacityOf, isSustained, type CapacityStep } from '../../bench/costs.js'

const step = (offeredRps: number, goodputRps: number, more: Partial<CapacityStep> = {}): CapacityStep => {
  const s = { offeredRps, goodputRps, non2xx: 0, errors: 0, p99: 3, cpu: { server: 0.5, generator: 0.4 }, ...more }
  return { ...s, sustained: isSustained(s) }
}

t.test(
  'a step is sustained only when every answer is 2xx, none failed, and the 2xx kept up with the offer',
  async (t) => {
    t.equal(isSustained(step(1000, 1000)), true)
    t.equal(isSustained(step(1000, 970)), true, '97% of the offer')
    t.equal(isSustained(step(1000, 969)), false, 'fell behind: a queue grew')
    t.equal(isSustained(step(1000, 1000, { non2xx: 1 })), false, 'one 503 (shed) is not sustained')
    t.equal(isSustained(step(1000, 1000, { errors: 1 })), false, 'one error or unsent request is not sustained')
  }
)

t.test('the capacity is the last sustained step before the first that was not', async (t) => {
  t.same(
    capacityOf([step(1000, 1000), step(1150, 1150), step(1322, 1100), step(1520, 1520)]),
    { rps: 1150, bounded: true },
    'a later step that happened to pass does not count'
  )
  t.same(
    capacityOf([step(1000, 1000), step(1150, 1150, { non2xx: 500 })]),
    { rps: 1000, bounded: true },
    'a step that shed is the bound, not its goodput'
  )
  t.same(
    capacityOf([step(1000, 1000), step(1150, 1150)]),
    { rps: 1150, bounded: false },
    'no step failed: a lower bound'
  )
  t.same(capacityOf([step(1000, 600)]), { rps: null, bounded: true }, 'the first step failed: no capacity')
  t.same(capacityOf([]), { rps: null, bounded: false })
})
