/** The OpenAPI document as GET /openapi.json serves it, from a gateway built but never listening. */
import { randomBytes } from 'node:crypto'
import { compose } from '../compose.js'
import { loadConfig } from '../config.js'

export async function openApiDocument (): Promise<string> {
  // The document does not depend on configuration: any valid one will do.
  const config = loadConfig({
    JWT_SECRET: randomBytes(32).toString('hex'), UPSTREAM_URL: 'http://127.0.0.1:9', METRICS_PORT: '0'
  })
  const gateway = await compose(config)
  try {
    await gateway.app.ready()
    return `${JSON.stringify(gateway.app.swagger(), null, 2)}\n`
  } finally {
    await gateway.close()
  }
}
