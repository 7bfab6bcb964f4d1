/**
 * Engine faults over real sockets (DECISIONS 8): refused, reset, hung, not
 * HTTP, not the contract. The gateway answers a simple error and recovers.
 */
import t from 'tap'
import { request } from 'undici'
import { contractHandler, faults, refusedPort, startStubUpstream, type StubHandler } from '../../fixtures/stub-upstream.js'
import { bearer, build, validUpdate } from '../helpers/app.js'

const ping = (url: string) => request(`${url}/api/portfolio/ping`, { headers: bearer() })
const update = (url: string) => request(`${url}/api/portfolio/update`, {
  method: 'POST', headers: { ...bearer(), 'content-type': 'application/json' }, body: JSON.stringify(validUpdate())
})

t.test('engine refuses the connection: 502', async (t) => {
  const port = await refusedPort()
  const { url } = await build(t, { upstreamUrl: `http://127.0.0.1:${port}` })
  for (const call of [ping, update]) {
    const res = await call(url)
    t.equal(res.statusCode, 502)
    t.same(await res.body.json(), { error: 'portfolio engine unavailable' })
  }
  const health = await request(`${url}/health`)
  t.equal(health.statusCode, 200, 'the gateway itself stays healthy')
  await health.body.dump()
})

const CASES: Array<[string, StubHandler, number, string]> = [
  ['resets the connection', faults.reset, 502, 'portfolio engine unavailable'],
  ['hangs past UPSTREAM_TIMEOUT_MS', faults.hang, 504, 'portfolio engine timed out'],
  ['answers bytes that are not HTTP', faults.garbage, 502, 'portfolio engine sent an invalid response'],
  ['answers JSON outside the contract', faults.wrongShape, 502, 'portfolio engine sent an invalid response'],
  ['answers an HTML 500', faults.htmlError, 502, 'portfolio engine sent an invalid response']
]

for (const [name, fault, status, message] of CASES) {
  t.test(`engine ${name}: ${status}, then recovery`, async (t) => {
    const stub = await startStubUpstream(fault)
    t.teardown(stub.close)
    const { url } = await build(t, { upstreamUrl: stub.url, env: { UPSTREAM_TIMEOUT_MS: '300' } })
    for (const call of [ping, update]) {
      const started = Date.now()
      const res = await call(url)
      t.equal(res.statusCode, status, `${call.name}: status`)
      t.same(await res.body.json(), { error: message }, `${call.name}: body`)
      t.ok(Date.now() - started < 5_000, 'answered within the 300 ms timeout budget, far from the 10 s default')
    }
    stub.handle(contractHandler)
    const again = await ping(url)
    t.equal(again.statusCode, 200, 'recovers once the engine behaves')
    t.equal(await again.body.text(), 'pong')
  })
}

t.test('engine comes back after being down', async (t) => {
  const port = await refusedPort()
  const { url } = await build(t, { upstreamUrl: `http://127.0.0.1:${port}` })
  const down = await ping(url)
  t.equal(down.statusCode, 502)
  await down.body.dump()
  const { createServer } = await import('node:http')
  const server = createServer((req, res) => contractHandler(req, res, Buffer.alloc(0))).listen(port, '127.0.0.1')
  t.teardown(() => { server.closeAllConnections(); server.close() })
  await new Promise((resolve) => server.once('listening', resolve))
  const up = await ping(url)
  t.equal(up.statusCode, 200)
  t.equal(await up.body.text(), 'pong')
})

t.test('an oversized engine response is refused, not buffered', async (t) => {
  const stub = await startStubUpstream((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(Buffer.alloc(2 * 1024 * 1024, 0x20))
  })
  t.teardown(stub.close)
  const { url } = await build(t, { upstreamUrl: stub.url })
  const res = await update(url)
  t.equal(res.statusCode, 502)
  t.same(await res.body.json(), { error: 'portfolio engine sent an invalid response' }, 'the internal limit is not told')
})
