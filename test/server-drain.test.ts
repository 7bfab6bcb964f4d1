/**
 * Drain under load: clients keep sending on kept-alive
 * sockets through SIGTERM, the 5 s production notice and the close. Every
 * request sent on an open (kept-alive, reused) connection must get an answer.
 * A new connection the listener refuses (ECONNREFUSED), or that the kernel had
 * completed but Node had not yet accepted when the listener closed (reset
 * before its first request was read), is a door closing, not a lost request:
 * the client knows nothing of it was processed and retries elsewhere.
 */
import { once } from 'node:events'
import { Agent, request as httpRequest } from 'node:http'
import t from 'tap'
import { startStubUpstream } from '../fixtures/stub-upstream.js'
import { SECRET } from './helpers/app.js'
import { ensureBuilt, freePort, GATEWAY_SCRIPT, startProcess } from './helpers/processes.js'

// Real gateway processes drained one after another, each with its notice: 39 s on a busy 2-core machine, too near tap's
// 60 s default.
t.setTimeout(120_000)

t.before(ensureBuilt)

interface Tally { answered: number, refused: number, resetAtTheDoor: number, lost: string[] }

/** One GET on a kept-alive agent: its status or the error code that ended it, and whether it went on a reused socket.
 *
 */
function get (url: string, agent: Agent): Promise<{ result: number | string, reused: boolean }> {
  return new Promise((resolve) => {
    const req = httpRequest(url, { agent }, (res) => {
      res.resume()
      res.on('end', () => resolve({ result: res.statusCode ?? 0, reused: req.reusedSocket }))
      res.on('error', (err: NodeJS.ErrnoException) => resolve({ result: err.code ?? 'error', reused: req.reusedSocket }))
    })
    req.on('error', (err: NodeJS.ErrnoException) => resolve({ result: err.code ?? 'error', reused: req.reusedSocket }))
    req.end()
  })
}

t.test('nothing sent on an open connection is lost during the drain', async (t) => {
  const stub = await startStubUpstream()
  t.teardown(stub.close)
  const port = await freePort()
  const gateway = await startProcess(t, GATEWAY_SCRIPT, {
    NODE_ENV: 'production',
    PORT: String(port),
    HOST: '127.0.0.1',
    LOG_LEVEL: 'info',
    METRICS_PORT: '0',
    JWT_SECRET: SECRET,
    UPSTREAM_URL: stub.url,
    SHED_EVENT_LOOP_DELAY_MS: '0',
    RATE_LIMIT_PER_MINUTE: '0'
  }, port, /gateway ready/)
  const exited = once(gateway.proc, 'exit')

  const tally: Tally = { answered: 0, refused: 0, resetAtTheDoor: 0, lost: [] }
  let sentBeforeSignal = 0
  let signalled = false
  let warmedUp: () => void = () => {}
  const warm = new Promise<void>((resolve) => { warmedUp = resolve })
  const worker = async (): Promise<void> => {
    const agent = new Agent({ keepAlive: true, maxSockets: 1 })
    try {
      for (;;) {
        const { result, reused } = await get(`${gateway.url}/ping`, agent)
        if (result === 200) tally.answered++
        else if (result === 'ECONNREFUSED') {
          tally.refused++
          return
        } else if (result === 'ECONNRESET' && !reused) tally.resetAtTheDoor++
        else tally.lost.push(`${String(result)} on a ${reused ? 'reused' : 'new'} connection`)
        if (!signalled && ++sentBeforeSignal === 500) warmedUp()
      }
    } finally {
      agent.destroy()
    }
  }
  const workers = Array.from({ length: 20 }, worker)
  await warm
  signalled = true
  gateway.proc.kill('SIGTERM')
  await Promise.all(workers)
  t.same(await exited, [0, null], 'the gateway exits cleanly')
  t.same(tally.lost, [], 'no request sent on an open connection went unanswered')
  t.equal(tally.refused, 20, 'each client stopped only when the listener refused it')
  t.ok(tally.answered > 500, `requests answered: ${tally.answered}; new connections reset at the door: ${tally.resetAtTheDoor}`)
  t.match(gateway.out(), /draining/)
})
