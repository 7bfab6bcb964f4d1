import { execFileSync } from 'node:child_process'
import { once } from 'node:events'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { createSecureServer } from 'node:http2'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { request } from 'undici'
import { bearer, SECRET } from '../helpers/app.js'
import { ensureBuilt, freePort, GATEWAY_SCRIPT, startProcess } from '../helpers/processes.js'

ensureBuilt()

// undici 8 negotiates HTTP/2 by default; the engine's bounds (connections, queue, upload share) count HTTP/1.1
// connections, so a TLS engine that offers h2 must still be spoken to in HTTP/1.1, by calls and health checks alike.
t.test('a TLS engine that offers HTTP/2 is spoken to in HTTP/1.1, calls and health checks alike', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'engine-tls-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const key = join(dir, 'key.pem')
  const cert = join(dir, 'cert.pem')
  execFileSync(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:P-256',
      '-nodes',
      '-days',
      '1',
      '-subj',
      '/CN=127.0.0.1',
      '-addext',
      'subjectAltName=IP:127.0.0.1',
      '-keyout',
      key,
      '-out',
      cert
    ],
    { stdio: 'ignore' }
  )
  const seen: string[] = []
  const engine = createSecureServer(
    { key: readFileSync(key), cert: readFileSync(cert), allowHTTP1: true },
    (req, res) => {
      seen.push(`${req.httpVersion} ${req.url}`)
      const body = req.url === '/health' ? '{"status":"ok"}' : 'pong'
      res.writeHead(200, { 'content-type': req.url === '/health' ? 'application/json' : 'text/plain; charset=utf-8' })
      res.end(body)
    }
  )
  engine.listen(0, '127.0.0.1')
  await once(engine, 'listening')
  t.teardown(() => {
    engine.close()
  })
  const port = await freePort()
  await startProcess(
    t,
    GATEWAY_SCRIPT,
    {
      PORT: String(port),
      HOST: '127.0.0.1',
      METRICS_PORT: '0',
      JWT_SECRET: SECRET,
      UPSTREAM_URL: `https://127.0.0.1:${(engine.address() as AddressInfo).port}`,
      NODE_EXTRA_CA_CERTS: cert
    },
    port,
    /gateway ready/
  )
  for (let i = 0; i < 3; i++) {
    const res = await request(`http://127.0.0.1:${port}/api/portfolio/ping`, { headers: bearer() })
    t.equal(res.statusCode, 200)
    t.equal(await res.body.text(), 'pong')
  }
  const pings = seen.filter((line) => line.endsWith(' /api/portfolio/ping'))
  t.same(pings, ['1.1 /api/portfolio/ping', '1.1 /api/portfolio/ping', '1.1 /api/portfolio/ping'])
  t.same(
    seen.filter((line) => !line.startsWith('1.1 ')),
    [],
    'no request of any kind over HTTP/2'
  )
})
