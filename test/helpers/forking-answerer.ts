/**
 * A process that forks one worker, as a gateway with GATEWAY_WORKERS=2 does:
 * the worker's front-like server (requireHostHeader: false, so the answer
 * check watches it) answers one request with a status no operation declares,
 * then both exit. The primary prints the worker's port.
 */
import { fork } from 'node:child_process'
import http from 'node:http'
import type { AddressInfo } from 'node:net'

if (process.argv.includes('--worker')) {
  const server = http.createServer({ requireHostHeader: false }, (_req, res) => {
    // Exit once the answer has been handed over (and checked: the check's 'finish' listener came first).
    res.once('finish', () => setImmediate(() => process.exit(0)))
    res.writeHead(418, { 'content-type': 'application/json', 'x-request-id': 'r' }).end('{"error":"teapot"}')
  })
  server.listen(0, '127.0.0.1', () => process.send!((server.address() as AddressInfo).port))
} else {
  const worker = fork(process.argv[1]!, ['--worker'])
  worker.once('message', (port) => console.log(`worker listening on ${String(port)}`))
  worker.once('exit', () => process.exit(0))
}
