import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { EngineEnvError, loadEngineEnv } from '../src/reference-engine/engine-env.js'

t.test('defaults', async (t) => {
  t.same(loadEngineEnv({}), { port: 4000, host: '127.0.0.1', imageDir: join(tmpdir(), 'portfolio-engine-images') })
  t.same(loadEngineEnv({ ENGINE_PORT: '', ENGINE_HOST: '' }).port, 4000, 'empty counts as unset')
})

t.test('values are read and converted', async (t) => {
  t.same(loadEngineEnv({ ENGINE_PORT: '4100', ENGINE_HOST: '0.0.0.0', ENGINE_IMAGE_DIR: '/srv/images' }), { port: 4100, host: '0.0.0.0', imageDir: '/srv/images' })
})

t.test('a bad value names the variable in one line', async (t) => {
  for (const port of ['abc', '70000', '-1', '40.5', '4e3', ' 4000']) {
    t.throws(() => loadEngineEnv({ ENGINE_PORT: port }), new EngineEnvError(`ENGINE_PORT="${port}" is invalid: expected an integer port, 0-65535`), port)
  }
})
