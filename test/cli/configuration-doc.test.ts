/**
 * docs/configuration.md is generated from the environment schemas
 * (src/cli/configuration-document.ts), so it lists every variable the code
 * reads with the default and range the code applies. A variable added to a
 * schema without `npm run docs:config` fails here.
 */
import { readFileSync } from 'node:fs'
import path from 'node:path'
import t from 'tap'
import { Env } from '../../schemas/env.js'
import { configurationDocument } from '../../src/cli/configuration-document.js'
import { EngineEnv } from '../../src/reference-engine/engine-env.js'
import { ROOT } from '../helpers/processes.js'

t.test('the committed docs/configuration.md is the generated one: run npm run docs:config', async (t) => {
  t.equal(readFileSync(path.join(ROOT, 'docs', 'configuration.md'), 'utf8'), configurationDocument())
})

t.test('every variable of both schemas has its row, with its default', async (t) => {
  const doc = configurationDocument()
  for (const name of [...Object.keys(Env.properties), ...Object.keys(EngineEnv.properties)]) t.match(doc, `| \`${name}\` |`, name)
  t.match(doc, '| `PORT` | `3000` | integer 0–65535 | listen port |')
  t.match(doc, '| `UPSTREAM_TRY_TIMEOUT_MS` | a third of `UPSTREAM_TIMEOUT_MS` |')
  t.match(doc, '| `ENGINE_METRICS_PORT` | `0` | integer 0–65535 |')
})
