/**
 * The engine's deduplication as the last guard (DECISIONS 16, 26): when a
 * gateway has no record of a key (another gateway without shared state, a
 * record a failover forgot, one past IDEMPOTENCY_TTL_S), the engine still
 * knows the key and the form it created. Two gateways, each with its own
 * in-process records, in front of one reference engine, over real sockets.
 */
import { readFileSync } from 'node:fs'
import t from 'tap'
import { request } from 'undici'
import { PNG_IMAGE } from '../../fixtures/images.js'
import { bearer, build, hs256 } from '../helpers/app.js'
import { startEngine } from '../helpers/engine.js'
import { multipartBody } from '../helpers/multipart.js'

const png = readFileSync(PNG_IMAGE)

t.test(
  "a key one gateway never saw: the same form answers the portfolio the key made, another form is the engine's 422, passed on unchanged",
  async (t) => {
    const engine = await startEngine(t)
    // Three gateways, none sharing records: each meets the key for the first time.
    const [a, b, c] = [
      await build(t, { upstreamUrl: engine.origin }),
      await build(t, { upstreamUrl: engine.origin }),
      await build(t, { upstreamUrl: engine.origin })
    ]
    const token = hs256({ sub: 'alice' })
    const create = async (url: string, name: string) => {
      const form = multipartBody([
        { name: 'name', value: name },
        { name: 'type', value: 'PORTFOLIO' },
        { name: 'image', filename: 'a.png', contentType: 'image/png', data: png }
      ])
      const res = await request(`${url}/api/portfolio/create`, {
        method: 'POST',
        headers: { ...bearer(token), 'content-type': form.contentType, 'idempotency-key': 'phone-key-1' },
        body: form.body
      })
      return { status: res.statusCode, replayed: res.headers['idempotent-replayed'], text: await res.body.text() }
    }
    const first = await create(a.url, 'Blue chips')
    t.equal(first.status, 200)
    const { portfolio_id: id } = JSON.parse(first.text) as { portfolio_id: string }

    const same = await create(b.url, 'Blue chips')
    t.equal(same.status, 200)
    t.same(JSON.parse(same.text), { portfolio_id: id }, 'the same form through another gateway: the one portfolio')
    t.equal(same.replayed, undefined, 'gateway B had no record: the engine decided')

    const other = await create(c.url, 'Something else')
    t.equal(other.status, 422)
    t.equal(
      other.text,
      '{"success":false,"error":{"source":"portfolio-engine","code":"IDEMPOTENCY_KEY_REUSED","message":"this Idempotency-Key was used for a different request","function":"createPortfolio"}}',
      "the engine's structured error, passed on unchanged (DECISIONS 8), as a gateway with the record would have answered"
    )
    t.equal(other.replayed, undefined, 'gateway C had no record: the engine decided')
    t.equal(engine.engine.portfolios.size, 1, 'the other form created nothing')

    const repeat = await create(c.url, 'Something else')
    t.equal(repeat.status, 422, "gateway C stored the engine's answer to that request, and replays it")
    t.equal(repeat.replayed, 'true')
  }
)
