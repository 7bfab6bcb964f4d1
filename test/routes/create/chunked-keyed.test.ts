/**
 * A chunked create (no Content-Length) with an Idempotency-Key on a Redis
 * store: the claim takes a round trip before the form parser is attached, and
 * the bytes that arrive meanwhile must wait for it, not flow past it (found by
 * test/limits/redis/cluster.test.ts: the form lost its first part, 400 "name is required").
 */
import { readFileSync } from 'node:fs'
import { Readable } from 'node:stream'
import t from 'tap'
import { request } from 'undici'
import { PNG_IMAGE } from '../../../fixtures/images.js'
import { startStubUpstream } from '../../../fixtures/stub-upstream.js'
import { bearer, build } from '../../helpers/app.js'
import { multipartBody } from '../../helpers/multipart.js'
import { requireRedis, startRedis } from '../../helpers/redis.js'

if (requireRedis(t)) {
  t.test('a chunked keyed create whose first bytes arrive before the claim is answered is read whole', async (t) => {
    const redis = await startRedis(t)
    const stub = await startStubUpstream()
    t.teardown(() => stub.close())
    const { url } = await build(t, { upstreamUrl: stub.url, env: { REDIS_URL: redis.url } })
    // Redis connects in the background: a counted ping (RateLimit header) says it is there.
    for (;;) {
      const ping = await request(`${url}/api/portfolio/ping`, { headers: bearer() })
      await ping.body.dump()
      if (ping.headers['ratelimit'] !== undefined) break
      await new Promise((resolve) => setTimeout(resolve, 20))
    }
    const form = multipartBody([
      { name: 'name', value: 'Chunked' },
      { name: 'type', value: 'PORTFOLIO' },
      { name: 'image', filename: 'a.png', contentType: 'image/png', data: readFileSync(PNG_IMAGE) }
    ])
    for (const split of [10, 120, form.body.length - 10]) {
      // No content-length: undici sends an async iterable chunked. The rest follows
      // only after the gateway has had time to read the first part and ask Redis.
      async function * body (): AsyncGenerator<Buffer> {
        yield form.body.subarray(0, split)
        await new Promise((resolve) => setTimeout(resolve, 50))
        yield form.body.subarray(split)
      }
      const res = await request(`${url}/api/portfolio/create`, {
        method: 'POST',
        headers: { ...bearer(), 'content-type': form.contentType, 'idempotency-key': `chunked-${split}` },
        body: Readable.from(body())
      })
      const answer = await res.body.json() as Record<string, unknown>
      t.equal(res.statusCode, 200, `split at ${split}: ${JSON.stringify(answer)}`)
      t.type(answer['portfolio_id'], 'string')
    }
    t.equal(stub.requests.filter((r) => r.url === '/api/portfolio/create').length, 3, 'each create reached the engine')
  })
}
