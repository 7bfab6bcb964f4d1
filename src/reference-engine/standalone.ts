/**
 * The engine as its own process (`npm run engine`), so the gateway can point
 * UPSTREAM_URL at it like any real upstream. The only engine file with side
 * effects: environment, listen, signals.
 */
import closeWithGrace from 'close-with-grace'
import { buildEngine } from './engine.js'
import { EngineEnvError, loadEngineEnv, type EngineSettings } from './engine-env.js'

let settings: EngineSettings
try {
  settings = loadEngineEnv(process.env)
} catch (err) {
  if (!(err instanceof EngineEnvError)) throw err
  process.stderr.write(`portfolio-engine: ${err.message}\n`)
  process.exit(1)
}

const engine = await buildEngine({ imageDir: settings.imageDir, logger: { level: 'info' } })

// SIGTERM/SIGINT: stop accepting, finish in-flight requests, then exit; give up after 10 s.
closeWithGrace({ delay: 10_000 }, async ({ signal, err }) => {
  if (err !== undefined) engine.log.error({ err }, 'closing the engine after an error')
  else engine.log.info({ signal }, 'closing the engine')
  await engine.close()
})

await engine.listen({ port: settings.port, host: settings.host })
engine.log.info({ imageDir: settings.imageDir }, 'portfolio engine ready')
