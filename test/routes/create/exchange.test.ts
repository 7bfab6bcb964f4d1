/**
 * A create's exchange (src/routes/create/exchange.ts) driven directly: every (state, event) pair of its
 * table, legal or not, and the effects of its steps on the clock, the per-user place and the upload
 * connection. The same exchange through real sockets is what the create-*.test.ts files exercise.
 */
import t from 'tap'
import { Writable } from 'node:stream'
import type { ServerResponse } from 'node:http'
import { GatewayError, validationError } from '../../../src/http/errors.js'
import { UploadShare } from '../../../src/limits/upload-share.js'
import { MinRate } from '../../../src/routes/create/min-rate.js'
import {
  CreateExchange, IllegalTransition, step, TRANSITIONS, type ExchangeEvent, type ExchangeParts, type ExchangeState
} from '../../../src/routes/create/exchange.js'

const STATES = Object.keys(TRANSITIONS) as ExchangeState[]
const EVENTS: ExchangeEvent[] = [
  'claim', 'read-whole', 'ask-invite', 'invite', 'sniff', 'whole-form', 'ask-slot', 'slot', 'stream',
  'body-sent', 'headers', 'call-over', 'read-rest', 'abort', 'end'
]
const LIVE = STATES.filter((s) => s !== 'done')

/** The lifecycle written out by hand: every pair not here must be refused. */
const EXPECTED: Record<string, ExchangeState> = {
  'admitted claim': 'claimed',
  'claimed read-whole': 'reading-whole',
  'claimed ask-invite': 'awaiting-invite',
  'claimed sniff': 'sniffing',
  'awaiting-invite invite': 'invited',
  'invited sniff': 'sniffing',
  'sniffing whole-form': 'awaiting-answer',
  'sniffing ask-slot': 'awaiting-slot',
  'sniffing stream': 'streaming',
  'awaiting-slot slot': 'streaming',
  'streaming body-sent': 'awaiting-answer',
  'streaming headers': 'answered',
  'streaming call-over': 'engine-done',
  'awaiting-answer headers': 'answered',
  'awaiting-answer call-over': 'engine-done',
  'answered body-sent': 'answered',
  'answered call-over': 'engine-done',
  'engine-done body-sent': 'engine-done',
  'engine-done read-rest': 'reading-rest',
  'reading-rest body-sent': 'reading-rest',
  'done abort': 'done',
  'done body-sent': 'done',
  ...Object.fromEntries(LIVE.flatMap((s) => [[`${s} abort`, s], [`${s} end`, 'done']]))
}

t.test('every (state, event) pair: the legal ones go where the lifecycle says, the rest throw', async (t) => {
  t.same(new Set(STATES).size, 13, 'thirteen states')
  for (const state of STATES) {
    for (const event of EVENTS) {
      const expected = EXPECTED[`${state} ${event}`]
      if (expected === undefined) {
        t.throws(() => step(state, event), new IllegalTransition(state, event), `${state} refuses ${event}`)
      } else {
        t.equal(step(state, event).to, expected, `${state} --${event}--> ${expected}`)
      }
    }
  }
})

t.test('ending gives back everything from every live state, and done takes no other step', async (t) => {
  for (const state of LIVE) {
    t.same(step(state, 'end').effects, ['giveSlot', 'givePlace', 'stopClock', 'unwatch'], state)
  }
  t.same(Object.keys(TRANSITIONS.done).sort(), ['abort', 'body-sent'])
})

class FakeResponse extends Writable {
  constructor () { super({ write: (_chunk, _encoding, done) => { done() } }) }
}

interface Rig { exchange: CreateExchange, share: UploadShare, response: FakeResponse, calls: string[] }

function rig (overrides: Partial<ExchangeParts> = {}): Rig {
  const share = new UploadShare({ maxPerUser: 1, maxConnections: 1, endpoints: () => 1 })
  const response = new FakeResponse()
  const calls: string[] = []
  const exchange = new CreateExchange({
    subject: 'alice',
    share,
    minRate: new MinRate(),
    responseTimeoutMs: 1_000,
    stallTimeoutMs: 1_000,
    response: response as unknown as ServerResponse,
    cut: () => { calls.push('cut') },
    invite: () => { calls.push('continue') },
    received: () => 0,
    slotWaited: () => { calls.push('waited') },
    unwatch: () => { calls.push('unwatch') },
    ...overrides
  })
  return { exchange, share, response, calls }
}

t.test('a streamed, keyed create: the place and the connection are taken and given back in order', async (t) => {
  const { exchange, share, response, calls } = rig()
  await exchange.claim()
  t.equal(exchange.state, 'claimed')
  t.ok(exchange.holdsPlace, 'the per-user place is held')
  await t.rejects(share.enter('alice'), { code: 'TOO_MANY_UPLOADS' }, 'a second create of the user is refused')
  exchange.sniff()
  await exchange.stream()
  t.equal(exchange.state, 'streaming')
  t.same(share.state, { streaming: 1, waiting: 0 }, 'an upload connection is held')
  exchange.timing.bodySent()
  t.equal(exchange.state, 'awaiting-answer')
  exchange.responded()
  exchange.callOver()
  t.equal(exchange.state, 'engine-done')
  t.same(share.state, { streaming: 0, waiting: 0 }, 'the connection goes back with the engine call')
  exchange.readRest()
  t.equal(exchange.state, 'reading-rest')
  exchange.dispose()
  t.equal(exchange.state, 'done')
  t.equal(exchange.endReason, 'answered')
  t.ok(exchange.holdsPlace, 'the place waits for the answer to be out')
  response.end()
  await new Promise((resolve) => response.once('finish', resolve))
  t.notOk(exchange.holdsPlace, 'and goes back then')
  const leave = await share.enter('alice')
  leave()
  exchange.dispose()
  t.same(calls, ['waited', 'unwatch'], 'dispose is idempotent: the route is unwatched once')
  t.same(exchange.illegal, [])
})

t.test('an invited create holds its connection from the invitation, then gives it back with a small form', async (t) => {
  const { exchange, share, calls } = rig()
  await exchange.claim()
  await exchange.invite()
  t.equal(exchange.state, 'invited')
  t.same(calls, ['waited', 'continue'], 'the wait is told, then 100 Continue is written')
  t.same(share.state.streaming, 1)
  exchange.sniff()
  exchange.wholeForm()
  t.equal(exchange.state, 'awaiting-answer')
  t.same(share.state.streaming, 0, 'a form with nothing to stream needs no upload connection')
  exchange.callOver()
  exchange.dispose()
  t.equal(exchange.endReason, 'answered')
})

t.test('an invited create streams on the connection it was invited with', async (t) => {
  const { exchange, share } = rig()
  await exchange.claim()
  await exchange.invite()
  exchange.sniff()
  await exchange.stream()
  t.equal(exchange.state, 'streaming')
  t.same(share.state, { streaming: 1, waiting: 0 }, 'the same connection, not a second one')
  exchange.dispose()
  t.same(share.state.streaming, 0, 'dispose gives back the connection held mid-stream')
})

t.test('the engine clock runs from the wait for a connection: past the timeout, a 504 reason', async (t) => {
  const { exchange } = rig({ responseTimeoutMs: 20 })
  await exchange.claim()
  exchange.sniff()
  await exchange.stream()
  await new Promise((resolve) => setTimeout(resolve, 60))
  t.equal((exchange.signal.reason as GatewayError).code, 'UPSTREAM_TIMEOUT')
  exchange.callOver()
  exchange.dispose()
})

t.test('the engine\'s answer stops the clock for good: a late body-sent arms nothing', async (t) => {
  const { exchange } = rig({ responseTimeoutMs: 20 })
  await exchange.claim()
  exchange.sniff()
  await exchange.stream()
  exchange.responded()
  exchange.timing.bodySent()
  t.equal(exchange.state, 'answered')
  await new Promise((resolve) => setTimeout(resolve, 60))
  t.equal(exchange.signal.aborted, false)
  exchange.callOver()
  exchange.dispose()
})

t.test('a refusal aborts the engine call with itself as the reason, and is why the exchange ended', async (t) => {
  const { exchange } = rig()
  await exchange.claim()
  exchange.sniff()
  await exchange.stream()
  const refusal = validationError('image must be PNG or JPEG')
  t.equal(exchange.fail(refusal), refusal, 'the client is told the refusal')
  t.equal(exchange.signal.reason, refusal)
  exchange.abort(validationError('later'))
  t.equal(exchange.signal.reason, refusal, 'the first reason stays')
  exchange.dispose()
  t.equal(exchange.endReason, 'refused')
})

t.test('a client that left mid-upload: the call is abandoned and the end says so', async (t) => {
  const { exchange } = rig()
  await exchange.claim()
  exchange.sniff()
  exchange.clientLeft()
  t.equal(exchange.signal.aborted, true)
  exchange.fail(exchange.signal.reason)
  exchange.dispose()
  t.equal(exchange.endReason, 'client-gone')
})

t.test('a failure that is not ours ends the exchange as failed, without aborting for it', async (t) => {
  const { exchange } = rig()
  exchange.fail(new Error('bug'))
  exchange.dispose()
  t.equal(exchange.endReason, 'failed')
  t.equal(exchange.signal.aborted, false)
})

t.test('a create refused its place never holds one', async (t) => {
  const { exchange, share } = rig()
  const other = await share.enter('alice')
  await t.rejects(exchange.claim(), { code: 'TOO_MANY_UPLOADS' })
  t.equal(exchange.state, 'admitted')
  exchange.dispose()
  t.equal(exchange.state, 'done')
  other()
})

t.test('an illegal step throws and is recorded; what it was granted is still given back', async (t) => {
  const { exchange, share } = rig()
  await t.rejects(exchange.stream(), new IllegalTransition('admitted', 'ask-slot'))
  t.same(exchange.illegal.map((e) => `${e.state} ${e.event}`), ['admitted ask-slot'])
  await exchange.claim()
  exchange.sniff()
  t.throws(() => { exchange.readRest() }, new IllegalTransition('sniffing', 'read-rest'))
  t.equal(exchange.illegal.length, 2)
  exchange.dispose()
  t.same(share.state.streaming, 0)
})

t.test('the per-chunk events: they time the engine while streaming, and change nothing once it has answered', async (t) => {
  const CHUNK_EVENTS: ExchangeEvent[] = ['hand-over', 'taken']
  const expected: Partial<Record<ExchangeState, string[]>> = {
    streaming: ['armStall', 'disarmStall'],
    answered: [],
    'engine-done': [],
    'reading-rest': []
  }
  for (const state of STATES) {
    for (const [i, event] of CHUNK_EVENTS.entries()) {
      const effects = expected[state]
      if (effects === undefined) {
        t.throws(() => step(state, event), new IllegalTransition(state, event), `${state} refuses ${event}`)
      } else {
        t.equal(step(state, event).to, state, `${state} --${event}--> ${state}`)
        t.same(step(state, event).effects, effects.slice(i, i + 1), `${state} ${event}: ${effects[i] ?? 'no effect'}`)
      }
    }
  }
})

t.test('a chunk out of order is an illegal step the exchange records', async (t) => {
  const { exchange } = rig()
  await exchange.claim()
  exchange.sniff()
  t.throws(() => { exchange.handedOver(1024) }, new IllegalTransition('sniffing', 'hand-over'))
  t.same(exchange.illegal.map((e) => `${e.state} ${e.event}`), ['sniffing hand-over'])
  exchange.dispose()
  exchange.handedOver(1024)
  exchange.taken()
  t.equal(exchange.illegal.length, 1, 'after the end a late chunk is dropped, not an illegal step')
})
