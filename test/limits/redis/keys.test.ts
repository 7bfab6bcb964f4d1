/**
 * Key names and slots (DECISIONS 26, src/limits/redis/keys.ts): the subject in
 * a hash tag, escaped so that nothing in a token can change its slot; the slot
 * computed as Redis Cluster does (checked against ioredis's own slot function
 * and a cluster-enabled redis-server's CLUSTER KEYSLOT); the counter batch
 * split by slot.
 */
import { mkdtempSync, rmSync } from 'node:fs'
import { createRequire } from 'node:module'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { randomBytes } from 'node:crypto'
import { Redis } from 'ioredis'
import t from 'tap'
import { escapeSubject, groupBySlot, hashTag, keySlot, recordKey, windowKey } from '../../../src/limits/redis/keys.js'
import { redisAvailable, REDIS_MISSING, startRedis } from '../../helpers/redis.js'

// The function ioredis routes cluster commands with (a dependency of ioredis, untyped).
const ioredisSlot = createRequire(import.meta.url)('cluster-key-slot') as (key: string) => number

t.test('a subject without braces appears as it is, so an operator can find its keys', async (t) => {
  t.equal(windowKey('alice', 29_512_345), 'pgw:rl:{alice}:29512345')
  t.equal(recordKey('alice', 'k-1'), 'pgw:idem:{alice}:k-1')
  t.equal(recordKey('auth0|5f7c8ec7c33c6c004bbafe82', 'x'), 'pgw:idem:{auth0|5f7c8ec7c33c6c004bbafe82}:x')
  t.equal(hashTag('user@example.com'), '{user@example.com}')
  t.equal(keySlot(windowKey('alice', 1)), keySlot(recordKey('alice', 'any key')), 'one user\'s counters and records share a slot')
})

t.test('a subject with %, { or } is escaped: its keys cannot leave the slot of the escaped subject', async (t) => {
  const cases: Array<[string, string]> = [
    ['a}b', 'a%7Db'],
    ['{evil}', '%7Bevil%7D'],
    ['}', '%7D'],
    ['50%', '50%25'],
    ['%7D', '%257D'],
    ['', '%']
  ]
  for (const [subject, escaped] of cases) {
    t.equal(escapeSubject(subject), escaped, JSON.stringify(subject))
    for (const key of [windowKey(subject, 7), recordKey(subject, 'k}{x')]) {
      t.equal(keySlot(key), keySlot(escaped), `${key}: the slot of the escaped subject`)
      t.equal(ioredisSlot(key), ioredisSlot(escaped), `${key}: as ioredis routes it`)
    }
  }
  // Without the escaping, '}' ends the tag early: 'a}b' would share the slot of every 'a...' subject.
  t.equal(keySlot('pgw:idem:{a}b}:k'), keySlot('a'), 'what the escaping prevents')
  t.not(escapeSubject('a}b'), escapeSubject('a%7Db'), 'distinct subjects stay distinct')
})

t.test('keySlot equals ioredis\'s slot function on 2,000 random keys', async (t) => {
  let same = 0
  for (let i = 0; i < 2_000; i++) {
    const subject = randomBytes(1 + (i % 40)).toString(i % 2 === 0 ? 'base64' : 'latin1')
    const key = i % 3 === 0 ? randomBytes(8).toString('hex') : windowKey(subject, i)
    if (keySlot(key) === ioredisSlot(key)) same++
  }
  t.equal(same, 2_000)
})

t.test('groupBySlot: one group per slot, keys in first-seen order', async (t) => {
  const keys = ['alice', 'bob', 'carol', 'alice', 'dave'].map((s, i) => windowKey(s, i))
  const groups = groupBySlot([...keys, recordKey('alice', 'k')])
  t.same([...groups.values()].flat().sort(), [...keys, recordKey('alice', 'k')].sort(), 'every key once')
  for (const [slot, group] of groups) for (const key of group) t.equal(keySlot(key), slot)
  t.same(groups.get(keySlot('alice')), [keys[0], keys[3], recordKey('alice', 'k')], 'alice\'s keys together')
  t.equal(groups.size, new Set(['alice', 'bob', 'carol', 'dave'].map(keySlot)).size)
})

t.test('a cluster-enabled redis-server computes the same slots', { skip: redisAvailable() || process.env['CI'] === 'true' ? false : REDIS_MISSING }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'redis-keyslot-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const redis = await startRedis(t, { args: ['--cluster-enabled', 'yes', '--dir', dir] })
  const probe = new Redis(redis.url)
  t.teardown(() => probe.disconnect())
  for (const subject of ['alice', 'a}b', '{evil}', '', 'user@example.com', '\u00e9\u00e8']) {
    for (const key of [windowKey(subject, 3), recordKey(subject, 'k')]) {
      t.equal(keySlot(key), await probe.cluster('KEYSLOT', key) as number, key)
    }
  }
})
