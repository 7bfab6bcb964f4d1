/**
 * The OpenAPI document as text, from an app that is built and never listens:
 * what `npm run openapi` commits and what the in-step test compares.
 */
import { randomBytes } from 'node:crypto'
import { buildApp } from '../app.js'
import { loadConfig } from '../config.js'
import { EngineClient } from '../engine-client/client.js'

export async function openApiDocument (): Promise<string> {
  // The document does not depend on configuration: any valid one will do.
  const config = loadConfig({ JWT_SECRET: randomBytes(32).toString('hex'), UPSTREAM_URL: 'http://127.0.0.1:9', METRICS_PORT: '0' })
  const engine = new EngineClient({ url: config.upstreamUrl!, timeoutMs: config.upstreamTimeoutMs })
  const app = await buildApp(config, { engine })
  try {
    await app.ready()
    return `${JSON.stringify(app.swagger(), null, 2)}\n`
  } finally {
    await app.close()
  }
}
