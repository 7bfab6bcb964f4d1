/** Request ids (DECISIONS 10): a sane client id is kept; ours are unique, UUID-shaped, and cost a counter. */
import type { IncomingMessage } from 'node:http'
import t from 'tap'
import { newRequestId, requestIdFrom } from '../src/http/request-id.js'

const withId = (id: string | string[] | undefined): IncomingMessage => ({ headers: id === undefined ? {} : { 'x-request-id': id } }) as unknown as IncomingMessage
const UUID_SHAPE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

t.test('a short printable client id is kept', async (t) => {
  t.equal(requestIdFrom(withId('haproxy-0A1B:2C3D')), 'haproxy-0A1B:2C3D')
  t.equal(requestIdFrom(withId('x'.repeat(128))), 'x'.repeat(128))
})

t.test('anything else gets an id of ours', async (t) => {
  for (const given of [undefined, '', 'x'.repeat(129), 'has space', 'tab\there', 'é', ['a', 'b']]) {
    t.match(requestIdFrom(withId(given)), UUID_SHAPE, JSON.stringify(given) ?? 'no header')
  }
})

t.test('our ids are unique and share one per-process prefix', async (t) => {
  const ids = Array.from({ length: 20_000 }, newRequestId)
  t.equal(new Set(ids).size, ids.length, 'no repeats')
  for (const id of ids.slice(0, 50)) t.match(id, UUID_SHAPE)
  t.equal(new Set(ids.map((id) => id.slice(0, 24))).size, 1, 'one prefix')
  t.not(ids[0], ids[1])
})
