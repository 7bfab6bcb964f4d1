import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { spawnSync } from 'node:child_process'
import t from 'tap'
import { EngineEnvError, loadEngineEnv } from '../../src/reference-engine/engine-env.js'
import { ENGINE_SCRIPT, ensureBuilt } from '../helpers/processes.js'

t.test('defaults', async (t) => {
  t.same(loadEngineEnv({}), { port: 4000, host: '127.0.0.1', imageDir: join(tmpdir(), 'portfolio-engine-images'), drainNoticeMs: 0, idempotencyTtlS: 172800 })
  t.same(loadEngineEnv({ ENGINE_PORT: '', ENGINE_HOST: '' }).port, 4000, 'empty counts as unset')
})

t.test('values are read and converted', async (t) => {
  t.same(loadEngineEnv({ ENGINE_PORT: '4100', ENGINE_HOST: '0.0.0.0', ENGINE_IMAGE_DIR: '/srv/images' }), { port: 4100, host: '0.0.0.0', imageDir: '/srv/images', drainNoticeMs: 0, idempotencyTtlS: 172800 })
  t.same(loadEngineEnv({ ENGINE_REDIS_URL: 'redis://:pw@10.0.0.5:6380/2' }).redisUrl, 'redis://:pw@10.0.0.5:6380/2')
  t.same(loadEngineEnv({ ENGINE_REDIS_URL: 'rediss://cache.internal:6379' }).redisUrl, 'rediss://cache.internal:6379')
  t.notOk('redisUrl' in loadEngineEnv({ ENGINE_REDIS_URL: '' }), 'empty: in memory')
})

t.test('a bad value names the variable in one line', async (t) => {
  for (const port of ['abc', '70000', '-1', '40.5', '4e3', ' 4000']) {
    t.throws(() => loadEngineEnv({ ENGINE_PORT: port }), new EngineEnvError(`ENGINE_PORT="${port}" is invalid: expected an integer port, 0-65535`), port)
  }
})

t.test('the drain notice (DECISIONS 25): 5 s in production, none in development and test, or ENGINE_DRAIN_NOTICE_MS', async (t) => {
  t.equal(loadEngineEnv({ NODE_ENV: 'production' }).drainNoticeMs, 5000)
  t.equal(loadEngineEnv({ NODE_ENV: 'development' }).drainNoticeMs, 0)
  t.equal(loadEngineEnv({ NODE_ENV: 'test' }).drainNoticeMs, 0)
  t.equal(loadEngineEnv({ NODE_ENV: 'test', ENGINE_DRAIN_NOTICE_MS: '250' }).drainNoticeMs, 250)
  t.equal(loadEngineEnv({ NODE_ENV: 'production', ENGINE_DRAIN_NOTICE_MS: '8000' }).drainNoticeMs, 8000)
  t.throws(() => loadEngineEnv({ NODE_ENV: 'production', ENGINE_DRAIN_NOTICE_MS: '1000' }), new EngineEnvError(
    'ENGINE_DRAIN_NOTICE_MS=1000 is too short for NODE_ENV=production: set at least 5000 (the gateway\'s health-check interval), or leave it unset'))
  for (const bad of ['abc', '-1', '1.5', '120001']) {
    t.throws(() => loadEngineEnv({ ENGINE_DRAIN_NOTICE_MS: bad }), new EngineEnvError(`ENGINE_DRAIN_NOTICE_MS="${bad}" is invalid: expected milliseconds, 0-120000, of /health 500 before the listener closes on SIGTERM`), bad)
  }
  t.throws(() => loadEngineEnv({ NODE_ENV: 'staging' }), new EngineEnvError('NODE_ENV="staging" is invalid: expected development, production or test; production gives a 5 s drain notice'))
})

t.test('ENGINE_IDEMPOTENCY_TTL_S: 48 h by default (longer than the gateway\'s 24 h), 1 s to 30 days', async (t) => {
  t.equal(loadEngineEnv({}).idempotencyTtlS, 172_800)
  t.equal(loadEngineEnv({ ENGINE_IDEMPOTENCY_TTL_S: '' }).idempotencyTtlS, 172_800, 'empty counts as unset')
  t.equal(loadEngineEnv({ ENGINE_IDEMPOTENCY_TTL_S: '604800' }).idempotencyTtlS, 604_800)
  for (const bad of ['0', '-5', '1.5', '2592001', 'two days']) {
    t.throws(() => loadEngineEnv({ ENGINE_IDEMPOTENCY_TTL_S: bad }), new EngineEnvError(`ENGINE_IDEMPOTENCY_TTL_S="${bad}" is invalid: expected seconds, 1-2592000, that the record of a create's Idempotency-Key lives; keep it longer than the gateways' IDEMPOTENCY_TTL_S`), bad)
  }
})

t.test('ENGINE_REDIS_URL must be a redis:// or rediss:// URL, and is never echoed', async (t) => {
  for (const bad of ['http://cache:6379', 'redis://', 'cache:6379', 'redis://a b@host']) {
    t.throws(() => loadEngineEnv({ ENGINE_REDIS_URL: bad }), new EngineEnvError('ENGINE_REDIS_URL=(hidden) is invalid: expected redis://[user:password@]host:port[/db] (or rediss://) for the portfolios that several engines share'), bad)
  }
})

t.test('the standalone engine stops at a bad value with that one line on stderr and exit code 1', async (t) => {
  ensureBuilt()
  const run = (env: Record<string, string>) => spawnSync(process.execPath, [ENGINE_SCRIPT], { env: { PATH: process.env['PATH'] ?? '', ENGINE_PORT: '0', ...env }, encoding: 'utf8', timeout: 30_000 })
  const short = run({ NODE_ENV: 'production', ENGINE_DRAIN_NOTICE_MS: '1000' })
  t.equal(short.status, 1)
  t.equal(short.stderr, 'portfolio-engine: ENGINE_DRAIN_NOTICE_MS=1000 is too short for NODE_ENV=production: set at least 5000 (the gateway\'s health-check interval), or leave it unset\n')
  const ttl = run({ ENGINE_IDEMPOTENCY_TTL_S: '0' })
  t.equal(ttl.status, 1)
  t.equal(ttl.stderr, 'portfolio-engine: ENGINE_IDEMPOTENCY_TTL_S="0" is invalid: expected seconds, 1-2592000, that the record of a create\'s Idempotency-Key lives; keep it longer than the gateways\' IDEMPOTENCY_TTL_S\n')
  const url = run({ ENGINE_REDIS_URL: 'http://user:secret@cache:6379' })
  t.equal(url.status, 1)
  t.equal(url.stderr, 'portfolio-engine: ENGINE_REDIS_URL=(hidden) is invalid: expected redis://[user:password@]host:port[/db] (or rediss://) for the portfolios that several engines share\n')
})
