/**
 * A linger's end is counted by who ended it (docs/decisions/0032-a-refused-upload-is-read-to-its-end.md): the
 * client (a close, a half-close, a reset), the gateway otherwise (its idle timeout destroys the socket), or the
 * gateway's close, which cuts every linger at once since none holds a request. Raw sockets, allowHalfOpen so the
 * server's FIN after its answer does not end their sending.
 */
import { once } from 'node:events'
import { connect, type Socket } from 'node:net'
import t from 'tap'
import { LINGER_END_REASONS } from '../../src/observability/metrics.js'
import { build, type Built } from '../helpers/app.js'
import { parseExposition, valueOf } from '../helpers/prometheus.js'

/** A refused create whose 8 MiB body has only begun: the server's side of it, once it lingers. */
async function lingering ({ app, url }: Built): Promise<{ client: Socket, server: Socket }> {
  const accepted = once(app.server, 'connection') as Promise<[Socket]>
  const client = connect({ port: Number(new URL(url).port), host: '127.0.0.1', allowHalfOpen: true })
  client.on('error', () => {}) // a cut socket is reset
  t.teardown(() => client.destroy())
  const [server] = await accepted
  client.resume()
  const answered = once(client, 'end')
  client.write('POST /api/portfolio/create HTTP/1.1\r\nhost: x\r\nauthorization: Bearer bad\r\n' +
    'content-type: multipart/form-data; boundary=b\r\ncontent-length: 8388608\r\n\r\n' + 'x'.repeat(1024))
  await answered
  return { client, server }
}

/** Not once(): it rejects on the reset the close may bring. */
const closeOf = async (socket: Socket): Promise<unknown> => await new Promise((resolve) => socket.once('close', resolve))

const endedBy = async (built: Built): Promise<Record<string, number | undefined>> => {
  const samples = parseExposition((await built.metrics.scrape()).body)
  return Object.fromEntries(LINGER_END_REASONS.map((reason) =>
    [reason, valueOf(samples, 'gateway_lingers_ended_total', { reason })]))
}

const zeros = Object.fromEntries(LINGER_END_REASONS.map((reason) => [reason, 0]))

t.test('every reason is counted from the start', async (t) => {
  const built = await build(t)
  t.same(await endedBy(built), zeros)
  t.same(LINGER_END_REASONS, [
    'complete', 'client_closed', 'server_closed', 'too_slow', 'over_bound', 'total_cap', 'address_cap', 'shutdown'
  ])
})

t.test('a linger the gateway closes is server_closed; one the client resets is client_closed', async (t) => {
  const built = await build(t)
  const byServer = await lingering(built)
  const closed = closeOf(byServer.server)
  // What the idle timeout does (front.ts cutOnIdle).
  byServer.server.destroy()
  await closed
  t.same(await endedBy(built), { ...zeros, server_closed: 1 })
  const byClient = await lingering(built)
  const reset = closeOf(byClient.server)
  byClient.client.resetAndDestroy()
  await reset
  t.same(await endedBy(built), { ...zeros, server_closed: 1, client_closed: 1 })
})

t.test('the gateway\'s close cuts every linger at once, counted as shutdown', async (t) => {
  const built = await build(t)
  const lingers = [await lingering(built), await lingering(built)]
  const cut = lingers.map(async ({ server }) => await closeOf(server))
  await built.app.close()
  await Promise.all(cut)
  t.same(await endedBy(built), { ...zeros, shutdown: 2 })
  const samples = parseExposition((await built.metrics.scrape()).body)
  t.equal(valueOf(samples, 'gateway_lingering_connections'), 0)
})
