/** Request ids (DECISIONS 10): a sane client id is kept; ours are random version-4 UUIDs, cheap to make, telling
 * nothing of the traffic.
 */
import type { IncomingMessage } from 'node:http'
import t from 'tap'
import { newRequestId, requestIdFrom } from '../../src/http/request-id.js'

const withId = (id: string | string[] | undefined): IncomingMessage => ({ headers: id === undefined ? {} : { 'x-request-id': id } }) as unknown as IncomingMessage
const UUID_SHAPE = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/

t.test('a short printable client id is kept', async (t) => {
  t.equal(requestIdFrom(withId('haproxy-0A1B:2C3D')), 'haproxy-0A1B:2C3D')
  t.equal(requestIdFrom(withId('x'.repeat(128))), 'x'.repeat(128))
})

t.test('anything else gets an id of ours', async (t) => {
  for (const given of [undefined, '', 'x'.repeat(129), 'has space', 'tab\there', 'é', ['a', 'b']]) {
    t.match(requestIdFrom(withId(given)), UUID_SHAPE, JSON.stringify(given) ?? 'no header')
  }
})

t.test('our ids are unique random version-4 UUIDs: neither a shared prefix nor a count to read', async (t) => {
  const ids = Array.from({ length: 20_000 }, newRequestId)
  t.equal(new Set(ids).size, ids.length, 'no repeats')
  t.same(ids.filter((id) => !UUID_SHAPE.test(id)), [], 'every one a version-4 UUID')
  // The first 8 digits are 32 random bits: among 20,000 ids about 0.05 repeats are expected by chance (more than 5
  // has odds near 1e-11), where ids that share a prefix (a time or a host in front) would repeat by the thousand.
  const prefixes = new Set(ids.map((id) => id.slice(0, 8))).size
  t.ok(prefixes >= ids.length - 5, `no shared prefix: ${prefixes} different first 8 digits of ${ids.length}`)
  const tails = ids.map((id) => parseInt(id.slice(24), 16))
  t.equal(tails.slice(1).filter((tail, i) => tail - tails[i]! === 1).length, 0, 'no id is its neighbour plus one')
  // Every hex digit of the random part shows up about equally often (a stuck or repeating source would not).
  const digits = new Map<string, number>()
  for (const id of ids) for (const c of id.slice(24)) digits.set(c, (digits.get(c) ?? 0) + 1)
  t.equal(digits.size, 16, 'all 16 digits appear')
  const expected = ids.length * 12 / 16
  t.same([...digits.values()].filter((n) => Math.abs(n - expected) > expected * 0.05), [], 'each within 5% of its share')
})
