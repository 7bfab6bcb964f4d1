/**
 * The gateway process: the only file with side effects. Config, logger,
 * engine pool, listen, signals, graceful close.
 */
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import closeWithGrace from 'close-with-grace'
import { buildApp } from './app.js'
import { ConfigError, loadConfig } from './config.js'
import { EngineClient } from './engine-client.js'
import { buildEngine } from './engine/engine.js'

let config
try {
  config = loadConfig(process.env)
} catch (err) {
  if (!(err instanceof ConfigError)) throw err
  process.stderr.write(`portfolio-gateway: ${err.message}\n`)
  process.exit(1)
}

const logger = {
  level: config.logLevel,
  // Nothing logs headers today; this keeps a future `req` serializer from leaking tokens.
  redact: { paths: ['req.headers.authorization', 'headers.authorization', 'req.headers.cookie'], censor: '[redacted]' }
}

// No UPSTREAM_URL: run the reference engine in this process, on loopback only.
const embedded = config.upstreamUrl === undefined
  ? await buildEngine({ imageDir: join(tmpdir(), 'portfolio-gateway-engine-images'), logger: { level: config.logLevel, name: 'engine' } })
  : undefined
const upstreamUrl = config.upstreamUrl ?? await embedded!.listen({ port: 0, host: '127.0.0.1' })

const engine = new EngineClient({ url: upstreamUrl, timeoutMs: config.upstreamTimeoutMs })
const lifecycle = { draining: false }
const app = await buildApp(config, { engine, lifecycle, logger })

closeWithGrace({ delay: 25_000 }, async ({ signal, err }) => {
  if (err !== undefined) app.log.error({ err }, 'fatal error, shutting down')
  else app.log.info({ signal }, 'draining: finishing requests in flight')
  lifecycle.draining = true
  await app.close()
  await engine.close()
  await embedded?.close()
  app.log.info('closed')
})

await app.listen({ port: config.port, host: config.host })
app.log.info({ upstream: embedded === undefined ? upstreamUrl : `embedded reference engine at ${upstreamUrl}` }, 'gateway ready')

if (config.jwt.generated) {
  const token = app.jwt.sign({ sub: 'dev-user' }, { expiresIn: '12h' })
  process.stdout.write([
    '',
    'Development mode: no JWT_SECRET or JWT_PUBLIC_KEY set, so a random HS256 secret was generated.',
    'This token (sub=dev-user) is valid for 12 hours, until this process stops:',
    '',
    `  export TOKEN=${token}`,
    `  curl -H "Authorization: Bearer $TOKEN" http://localhost:${config.port}/api/portfolio/ping`,
    '',
    'Set JWT_SECRET to keep tokens across restarts; `npm run token -- --sub alice` then prints more.',
    ''
  ].join('\n'))
}
