/**
 * A refusal is the client's, never the engine's (DECISIONS 23, 24): a
 * create whose engine request the gateway aborts because it refused the form,
 * or because the client left, is counted under outcome="client_aborted" and
 * never toward outlier detection. Two stub engines on real sockets; every
 * client mistake below is made 20 times. A control shows that an engine that
 * really fails is still ejected.
 */
import t from 'tap'
import { request } from 'undici'
import { faults, startStubUpstream, type StubUpstream } from '../../fixtures/stub-upstream.js'
import { bearer, build, type BuildOptions } from '../helpers/app.js'
import { attemptUntil } from '../helpers/engine.js'
import { CREATE_FIELDS, createValidationError, imagePart, multipartBody, pngOfSize } from '../helpers/multipart.js'
import { slowCreate } from '../helpers/slow-upload.js'
import { chunkOf, rawConnection } from '../helpers/raw-client.js'
import { parseExposition, valueOf } from '../helpers/prometheus.js'

t.setTimeout(120_000)

const KiB = 1024
const MiB = 1024 * KiB
const TIMES = 20
/**
 * Health checks off and the balancer's randomness fixed at 0: with nothing in
 * flight every call goes to the first engine, so its failures would be
 * consecutive and the fifth would eject it.
 */
const CLUSTER: BuildOptions = {
  env: { RATE_LIMIT_PER_MINUTE: '0' },
  cluster: { health: { intervalMs: 0 }, random: () => 0 }
}

interface Built {
  metrics: { scrape: () => Promise<{ body: string }> }
  url: string
}

async function engines (t: { teardown: (fn: () => unknown) => void }): Promise<[StubUpstream, StubUpstream]> {
  const a = await startStubUpstream()
  const b = await startStubUpstream()
  t.teardown(a.close)
  t.teardown(b.close)
  return [a, b]
}

/** The counts this test is about, per engine. */
async function tally (gateway: Pick<Built, 'metrics'>, stubs: StubUpstream[]) {
  const samples = parseExposition((await gateway.metrics.scrape()).body)
  const per = (name: string, labels: Record<string, string>): number[] =>
    stubs.map((s) => valueOf(samples, name, { ...labels, endpoint: `127.0.0.1:${s.port}` }) ?? 0)
  const sum = (xs: number[]): number => xs.reduce((x, y) => x + y, 0)
  return {
    ejections: per('gateway_engine_ejections_total', {}),
    up: per('gateway_engine_endpoint_up', {}),
    clientAborted: sum(per('gateway_engine_calls_total', { call: 'create', outcome: 'client_aborted' })),
    unavailable: sum(per('gateway_engine_calls_total', { call: 'create', outcome: 'unavailable' }))
  }
}

t.test('client mistakes, 20 times each, eject no engine and are counted as client_aborted', async (t) => {
  const stubs = await engines(t)
  const { metrics, url } = await build(t, { ...CLUSTER, upstreamUrls: stubs.map((s) => s.url) })
  const before = await tally({ metrics }, stubs)
  t.same(before.up, [1, 1])

  // 1. A bad field after the image: the engine request is under way when the name is read.
  const badAfter = multipartBody([CREATE_FIELDS[1]!, imagePart(pngOfSize(64 * KiB)), { name: 'name', value: '' }])
  for (let i = 0; i < TIMES; i++) {
    const res = await request(`${url}/api/portfolio/create`, {
      method: 'POST',
      headers: { ...bearer(), 'content-type': badAfter.contentType },
      body: badAfter.body
    })
    t.equal(res.statusCode, 400)
    t.same(await res.body.json(), createValidationError('name must be at least 1 character'))
  }
  const afterBadField = await tally({ metrics }, stubs)
  t.comment(
    `bad field after the image x${TIMES}: ejections ${JSON.stringify(afterBadField.ejections)}, up ${JSON.stringify(afterBadField.up)}, client_aborted ${afterBadField.clientAborted}, unavailable ${afterBadField.unavailable}`
  )
  t.same(afterBadField.ejections, [0, 0], 'no engine ejected')
  t.same(afterBadField.up, [1, 1], 'both engines in rotation')
  t.equal(afterBadField.clientAborted, TIMES, "every aborted engine call counted as the client's")
  t.equal(afterBadField.unavailable, 0, 'none blamed on an engine')

  // 2. An oversized chunked body: no length declared; the image passes its bound mid-upload.
  const { body: head, contentType } = multipartBody([...CREATE_FIELDS, imagePart(pngOfSize(64 * KiB))])
  const formStart = head.subarray(0, head.indexOf(Buffer.from([0x89, 0x50, 0x4e, 0x47])) + 8)
  const filler = chunkOf(Buffer.alloc(64 * KiB, 0x42))
  for (let i = 0; i < TIMES; i++) {
    const client = await rawConnection(t, url)
    client.socket.write(
      `POST /api/portfolio/create HTTP/1.1\r\nhost: gateway\r\nauthorization: ${bearer().authorization}\r\ncontent-type: ${contentType}\r\ntransfer-encoding: chunked\r\n\r\n`
    )
    client.socket.write(chunkOf(formStart))
    // Past the image bound (10 MiB) and the body bound, unless the answer comes first.
    for (let sent = 0; sent <= 11 * MiB && client.received() === '' && !client.socket.destroyed; sent += 64 * KiB) {
      await client.write(filler)
    }
    const [status, text] = await client.answer()
    t.match(status, /^HTTP\/1\.1 400 /)
    t.same(JSON.parse(text), createValidationError('image must be at most 10485760 bytes'))
  }
  const afterChunked = await attemptUntil(
    async () => await tally({ metrics }, stubs),
    (n) => n.clientAborted >= 2 * TIMES,
    10_000
  )
  t.comment(
    `oversized chunked body x${TIMES}: ejections ${JSON.stringify(afterChunked.ejections)}, up ${JSON.stringify(afterChunked.up)}, client_aborted ${afterChunked.clientAborted}, unavailable ${afterChunked.unavailable}`
  )
  t.same(afterChunked.ejections, [0, 0])
  t.same(afterChunked.up, [1, 1])
  t.equal(afterChunked.clientAborted, 2 * TIMES)
  t.equal(afterChunked.unavailable, 0)

  // 3. A client that leaves mid-image, once its engine request has begun.
  const whole = multipartBody([...CREATE_FIELDS, imagePart(pngOfSize(2 * MiB))])
  for (let i = 0; i < TIMES; i++) {
    const started = stubs[0]!.stats.started + stubs[1]!.stats.started
    const client = await rawConnection(t, url)
    client.socket.write(
      `POST /api/portfolio/create HTTP/1.1\r\nhost: gateway\r\nauthorization: ${bearer().authorization}\r\ncontent-type: ${whole.contentType}\r\ncontent-length: ${whole.body.length}\r\n\r\n`
    )
    client.socket.write(whole.body.subarray(0, 256 * KiB))
    await attemptUntil(
      async () => stubs[0]!.stats.started + stubs[1]!.stats.started,
      (n) => n > started,
      10_000
    )
    client.socket.destroy()
    await client.closed
    t.equal(client.received(), '', 'the client left before any answer')
  }
  const afterLeft = await attemptUntil(
    async () => await tally({ metrics }, stubs),
    (n) => n.clientAborted >= 3 * TIMES,
    10_000
  )
  t.comment(
    `client left mid-image x${TIMES}: ejections ${JSON.stringify(afterLeft.ejections)}, up ${JSON.stringify(afterLeft.up)}, client_aborted ${afterLeft.clientAborted}, unavailable ${afterLeft.unavailable}`
  )
  t.same(afterLeft.ejections, [0, 0])
  t.same(afterLeft.up, [1, 1])
  t.equal(afterLeft.clientAborted, 3 * TIMES)
  t.equal(afterLeft.unavailable, 0)

  // Engines are still used: a valid create is answered by one.
  const valid = multipartBody([...CREATE_FIELDS, imagePart(pngOfSize(64 * KiB))])
  const ok = await request(`${url}/api/portfolio/create`, {
    method: 'POST',
    headers: { ...bearer(), 'content-type': valid.contentType },
    body: valid.body
  })
  t.equal(ok.statusCode, 200)
  t.same(await ok.body.json(), { portfolio_id: 'p-stub-1' })
})

t.test(
  'a client too slow for the minimum rate (cut off with 408), 6 times: no engine ejected, counted as client_aborted',
  async (t) => {
    const stubs = await engines(t)
    const { metrics, url } = await build(t, {
      ...CLUSTER,
      upstreamUrls: stubs.map((s) => s.url),
      uploadMinRate: { stallMs: 300, windowMs: 60_000, bytesPerS: 1, tickMs: 100 }
    })
    for (let i = 0; i < 6; i++) {
      const slow = slowCreate(url, `slow-${i}`, { kind: 'hold' })
      const answer = await slow.answer
      slow.stop()
      t.equal(answer.status, 408)
      t.same(JSON.parse(answer.text), { error: 'upload stalled: no byte for 0.3 s' })
    }
    const after = await attemptUntil(
      async () => await tally({ metrics }, stubs),
      (n) => n.clientAborted >= 6,
      10_000
    )
    t.comment(
      `too slow x6: ejections ${JSON.stringify(after.ejections)}, up ${JSON.stringify(after.up)}, client_aborted ${after.clientAborted}, unavailable ${after.unavailable}`
    )
    t.same(after.ejections, [0, 0])
    t.same(after.up, [1, 1])
    t.equal(after.clientAborted, 6)
    t.equal(after.unavailable, 0)
  }
)

t.test(
  'control: what the engine does still counts against it: an engine that resets every request is ejected after its fifth failure, one that is gone leaves the rotation at its first refusal',
  async (t) => {
    const resetting = await startStubUpstream(faults.reset)
    const left = await startStubUpstream()
    t.teardown(resetting.close)
    t.teardown(left.close)
    const stubs = [resetting, left]
    const { metrics, url } = await build(t, { ...CLUSTER, upstreamUrls: stubs.map((s) => s.url) })
    for (let i = 0; i < 10; i++) {
      const res = await request(`${url}/api/portfolio/ping`, { headers: bearer() })
      t.equal(res.statusCode, 200, 'retried onto the engine left')
      t.equal(await res.body.text(), 'pong')
    }
    const after = await tally({ metrics }, stubs)
    t.comment(`resetting engine: ejections ${JSON.stringify(after.ejections)}, up ${JSON.stringify(after.up)}`)
    t.same(after.ejections, [1, 0], 'the resetting engine is ejected, once')
    t.same(after.up, [0, 1])

    // Gone: its refusal marks it unreachable, and the balancer passes it over from then on.
    const gone = await startStubUpstream()
    const other = await startStubUpstream()
    t.teardown(other.close)
    const built = await build(t, { ...CLUSTER, upstreamUrls: [gone.url, other.url] })
    await gone.close()
    for (let i = 0; i < 10; i++) {
      const res = await request(`${built.url}/api/portfolio/ping`, { headers: bearer() })
      t.equal(res.statusCode, 200, 'answered by the engine left')
      await res.body.text()
    }
    const retries =
      valueOf(parseExposition((await built.metrics.scrape()).body), 'gateway_engine_retries_total', {
        call: 'ping',
        reason: 'unreachable'
      }) ?? 0
    t.ok(retries >= 1 && retries <= 2, `the gone engine was tried at most twice, then passed over (${retries} retries)`)
  }
)
