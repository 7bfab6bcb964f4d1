/**
 * bench/run.ts --runtime: one run measures each scenario once per node binary
 * (and build), the copies of a scenario back to back with their order turned
 * each round, and reads each runtime against the first within the round.
 */
import t from 'tap'
import {
  formatRuntimeMarkdown, parseRuntime, runtimeSchedule, runtimeTable, withRuntimes, type Runtime
} from '../../bench/runtimes.js'
import { SCENARIOS } from '../../bench/scenarios.js'
import type { Measurement } from '../../bench/schedule.js'

const runtimes: Runtime[] = [
  { label: 'a', node: '/a/node', dist: '/old/dist' },
  { label: 'b', node: '/b/node', dist: '/old/dist' },
  { label: 'c', node: '/b/node', dist: '/new/dist' }
]

t.test('--runtime reads LABEL=NODE[,DIST], the build defaulting to the harness\'s own', async (t) => {
  t.same(parseRuntime('node20=/usr/bin/node,/work/old/dist', '/own/dist'),
    { label: 'node20', node: '/usr/bin/node', dist: '/work/old/dist' })
  t.same(parseRuntime('node24=/opt/node', '/own/dist'), { label: 'node24', node: '/opt/node', dist: '/own/dist' })
  t.throws(() => parseRuntime('/usr/bin/node', '/own'), {
    message: '--runtime /usr/bin/node: expected LABEL=NODE or LABEL=NODE,DIST ' +
      '(e.g. node20=/usr/bin/node,/work/old/dist)'
  })
})

t.test('each scenario served from a build gets one copy per runtime, on its own target, no cost row', async (t) => {
  const chosen = SCENARIOS.filter((s) => ['direct', 'bare-ping', 'ping'].includes(s.name))
  const copies = withRuntimes(chosen, runtimes.slice(0, 2))
  t.same(copies.map((s) => [s.name, s.target, s.cost]), [
    ['bare-ping@a', 'bare@a', undefined], ['bare-ping@b', 'bare@b', undefined],
    ['ping@a', 'gateway@a', undefined], ['ping@b', 'gateway@b', undefined]
  ], 'the mock itself (direct) is not copied')
})

t.test('a round measures a scenario\'s copies back to back, their order turned by one each round', async (t) => {
  const names = ['bare-ping@a', 'bare-ping@b', 'bare-ping@c', 'ping@a', 'ping@b', 'ping@c']
  t.same(runtimeSchedule(names, runtimes, 1), names)
  t.same(runtimeSchedule(names, runtimes, 2),
    ['bare-ping@b', 'bare-ping@c', 'bare-ping@a', 'ping@b', 'ping@c', 'ping@a'])
  t.same(runtimeSchedule(names, runtimes, 3),
    ['bare-ping@c', 'bare-ping@a', 'bare-ping@b', 'ping@c', 'ping@a', 'ping@b'])
  t.same(runtimeSchedule(names, runtimes, 4), names, 'the fourth round is the first again')
})

t.test('each runtime is read against the first runtime in its round, the median of rounds', async (t) => {
  const m = (scenario: string, usPerRequest: number): Measurement => ({ scenario, usPerRequest })
  // Round 2 is twice as dear throughout (a neighbour): the ratios do not move.
  const measured = [
    [m('bare-ping@a', 60), m('bare-ping@b', 66), m('ping@a', 90), m('ping@b', 81)],
    [m('bare-ping@b', 132), m('bare-ping@a', 120), m('ping@b', 162), m('ping@a', 180)],
    [m('bare-ping@a', 61), m('bare-ping@b', Number.NaN), m('ping@a', 91), m('ping@b', 82)]
  ]
  const rows = runtimeTable(['bare-ping', 'ping'], runtimes.slice(0, 2), measured)
  t.same(rows, [
    {
      scenario: 'bare-ping',
      usPerRequest: { a: 61, b: 99 },
      ratioToFirst: { a: 1, b: 1.1 },
      ratioToBare: { a: 1, b: 1 },
      perRound: { a: [1, 1, 1], b: [1.1, 1.1, Number.NaN] }
    },
    {
      scenario: 'ping',
      usPerRequest: { a: 91, b: 82 },
      ratioToFirst: { a: 1, b: 0.9 },
      ratioToBare: { a: 1.5, b: 1.227 },
      perRound: { a: [1, 1, 1], b: [0.9, 0.9, 0.901] }
    }
  ])
  t.equal(formatRuntimeMarkdown(rows, runtimes.slice(0, 2)), [
    '| Scenario | a µs/req | b µs/req | b / a | a × its bare proxy | b × its bare proxy |',
    '|---|---:|---:|---:|---:|---:|',
    '| `bare-ping` | 61 | 99 | 1.10 | 1.00 | 1.00 |',
    '| `ping` | 91 | 82 | 0.90 | 1.50 | 1.23 |'
  ].join('\n'))
})
