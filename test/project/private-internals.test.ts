/**
 * The private internals of Node.js and undici that the gateway leans on (docs/architecture.md, "Private
 * internals"), each pinned here by the behaviour the code expects, so an upgrade that changes one fails
 * this file by name instead of a behaviour test far away.
 */
import { once } from 'node:events'
import { readFileSync } from 'node:fs'
import { createServer, type ServerResponse } from 'node:http'
import { connect, type AddressInfo, type Socket } from 'node:net'
import { join } from 'node:path'
import t, { type Test } from 'tap'
import { Pool, type Dispatcher } from 'undici'
import { kQueuedAbort } from '../../src/engine-client/attempt.js'
import { queuedSymbolOf } from '../../src/engine-client/client.js'
import { backoff } from '../../src/limits/redis/client.js'
import { ROOT } from '../helpers/processes.js'

type Controller = Parameters<NonNullable<Dispatcher.DispatchHandler['onRequestStart']>>[0]

async function server (
  t: Test,
  hold: boolean
): Promise<{ url: string; connections: () => number; held: ServerResponse[] }> {
  let connections = 0
  const held: ServerResponse[] = []
  const s = createServer((_req, res) => {
    if (hold) held.push(res)
    else res.end('ok')
  })
  s.on('connection', () => {
    connections++
  })
  s.listen(0, '127.0.0.1')
  await once(s, 'listening')
  t.teardown(async () => {
    for (const res of held) res.end()
    s.closeAllConnections()
    s.close()
  })
  return { url: `http://127.0.0.1:${(s.address() as AddressInfo).port}`, connections: () => connections, held }
}

class Recorder implements Dispatcher.DispatchHandler {
  error: Error | undefined
  status = 0
  readonly done: Promise<void>
  #resolve!: () => void
  constructor (readonly throwOnStart?: Error) {
    this.done = new Promise((resolve) => {
      this.#resolve = resolve
    })
  }

  onRequestStart (_c: Controller): void {
    if (this.throwOnStart !== undefined) throw this.throwOnStart
  }

  onResponseStart (_c: Controller, status: number): void {
    this.status = status
  }

  onResponseData (): void {}
  onResponseEnd (): void {
    this.#resolve()
  }

  onResponseError (_c: Controller, err: Error): void {
    this.error = err
    this.#resolve()
  }
}

t.test('undici: a Pool keeps its count of queued requests under an own symbol described "queued"', async (t) => {
  const { url, held } = await server(t, true)
  const pool = new Pool(url, { connections: 1 })
  t.teardown(() => pool.destroy())
  const symbol = queuedSymbolOf(pool)
  t.ok(symbol !== undefined, 'the symbol is found')
  const count = (): unknown => (pool as unknown as Record<symbol, unknown>)[symbol!]
  t.equal(count(), 0)
  const handlers = [new Recorder(), new Recorder(), new Recorder()]
  for (const h of handlers) pool.dispatch({ origin: url, path: '/', method: 'GET' }, h)
  while (held.length === 0) await new Promise((resolve) => setImmediate(resolve))
  t.equal(count(), 2, 'one on the socket, two queued')
})

t.test(
  "undici: a handler that throws from onRequestStart fails its request, and the socket stays (writeH1's catch)",
  async (t) => {
    const { url, connections } = await server(t, false)
    const pool = new Pool(url, { connections: 1 })
    t.teardown(() => pool.destroy())
    const warm = new Recorder()
    pool.dispatch({ origin: url, path: '/', method: 'GET' }, warm)
    await warm.done
    t.equal(warm.status, 200)
    const given = new Error('given up')
    const thrower = new Recorder(given)
    pool.dispatch({ origin: url, path: '/', method: 'GET' }, thrower)
    await thrower.done
    t.equal(thrower.error, given, 'the request fails with the thrown error')
    const next = new Recorder()
    pool.dispatch({ origin: url, path: '/', method: 'GET' }, next)
    await next.done
    t.equal(next.status, 200)
    t.equal(connections(), 1, 'the next request reuses the socket: none was destroyed')
  }
)

t.test(
  "undici: lib/core/symbols.js's kQueuedAbort hands a queued request a cancel that takes it out of the Pool's queue",
  async (t) => {
    const { url, held, connections } = await server(t, true)
    const pool = new Pool(url, { connections: 1 })
    t.teardown(() => pool.destroy())
    t.equal(typeof kQueuedAbort, 'symbol', 'the symbol is exported')
    const first = new Recorder()
    pool.dispatch({ origin: url, path: '/', method: 'GET' }, first)
    while (held.length === 0) await new Promise((resolve) => setImmediate(resolve))
    let cancel: ((reason: Error) => void) | undefined
    const queued = new Recorder()
    pool.dispatch({ origin: url, path: '/', method: 'GET', [kQueuedAbort]: (c: typeof cancel) => { cancel = c } }, queued)
    t.equal(typeof cancel, 'function', 'the hook is called as the request enters the queue')
    const reason = new Error('given up')
    cancel!(reason)
    t.equal(queued.error, reason, "the handler's onResponseError is called at once with the reason")
    t.equal(pool.stats.queued, 0, 'the request left the queue')
    // The engine closes the one connection: nothing waits, so nothing connects again.
    held[0]!.setHeader('connection', 'close')
    held[0]!.end('ok')
    await first.done
    await pool.close()
    t.equal(connections(), 1, 'no connection was opened for the request given up')
  }
)

t.test("node: a server socket's _httpMessage is the response being written on it", async (t) => {
  let seen: unknown
  const s = createServer((req, res) => {
    seen = (req.socket as Socket & { _httpMessage?: ServerResponse | null })._httpMessage === res
    res.end('ok')
  })
  s.listen(0, '127.0.0.1')
  await once(s, 'listening')
  t.teardown(() => s.close())
  const res = await fetch(`http://127.0.0.1:${(s.address() as AddressInfo).port}/`)
  await res.text()
  t.equal(seen, true)
})

t.test('node: an answer with connection: close ends its socket through socket.destroySoon()', async (t) => {
  let called = 0
  const s = createServer((req, res) => {
    const socket = req.socket
    const original = socket.destroySoon.bind(socket)
    socket.destroySoon = () => {
      called++
      original()
    }
    res.setHeader('connection', 'close')
    res.end('ok')
  })
  s.listen(0, '127.0.0.1')
  await once(s, 'listening')
  t.teardown(() => s.close())
  const res = await fetch(`http://127.0.0.1:${(s.address() as AddressInfo).port}/`)
  t.equal(await res.text(), 'ok')
  t.equal(res.headers.get('connection'), 'close')
  t.equal(called, 1, "Node's resOnFinish called the socket's own destroySoon once")
})

t.test("node: a 'data' listener on a server socket takes the HTTP parser off it; without Node's own, nothing is parsed", async (t) => {
  let raw = 0
  let parsed = 0
  let arrived = (): void => {}
  let allRead = (): void => {}
  const requestIn = new Promise<void>((resolve) => { arrived = resolve })
  const bodyIn = new Promise<void>((resolve) => { allRead = resolve })
  const body = '1\r\nx\r\n'.repeat(100)
  const s = createServer((req) => {
    req.on('data', () => { parsed++ })
    const socket = req.socket
    const drop = (chunk: Buffer): void => {
      raw += chunk.length
      if (raw >= body.length) allRead()
    }
    socket.on('data', drop)
    for (const listener of socket.listeners('data')) if (listener !== drop) socket.off('data', listener as () => void)
    arrived()
  })
  s.listen(0, '127.0.0.1')
  await once(s, 'listening')
  t.teardown(() => { s.closeAllConnections(); s.close() })
  const client = connect((s.address() as AddressInfo).port, '127.0.0.1')
  t.teardown(() => client.destroy())
  client.write('POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n')
  await requestIn
  client.write(body)
  await bodyIn
  t.equal(raw, body.length, 'every byte came to the socket\'s own listener')
  t.equal(parsed, 0, 'none went through the parser to the request')
})

// ioredis's: pinned by name in its built source, where their behaviour needs a Redis that stalls on cue
// (the Redis tests exercise them: redis-hang, redis-store's queue checks).
t.test(
  'ioredis: socketTimeoutTimer, Command._commandTimeoutTimer and the "Stream isn\'t writeable" refusal still exist',
  async (t) => {
    const built = join(ROOT, 'node_modules', 'ioredis', 'built')
    t.match(readFileSync(join(built, 'Redis.js'), 'utf8'), /this\.socketTimeoutTimer\b/)
    t.match(readFileSync(join(built, 'Command.js'), 'utf8'), /this\._commandTimeoutTimer\b/)
    t.match(readFileSync(join(built, 'Redis.js'), 'utf8'), /Stream isn't writeable/)
  }
)

// The socketTimeoutTimer is cleared on 'close', a tick after the socket closed: in time only while no reconnect
// comes sooner, or the new socket's own timer would be cleared and a hang of the new connection go unseen.
t.test('ioredis: no reconnect comes within a tick of a close (the first waits 50 ms)', async (t) => {
  for (const times of [1, 2, 5, 100]) t.ok(backoff(times) >= 50, `reconnect ${times} waits ${backoff(times)} ms`)
})
