import { once } from 'node:events'
import { connect, type Socket } from 'node:net'
import type { Test } from 'tap'
import type { Built } from './app.js'

/** A raw client of `built` that may keep sending after the server's FIN, and the server's side of its connection. */
export async function openRaw (
  t: Test,
  { app, url }: Built
): Promise<{ client: Socket, server: Socket, text: () => string }> {
  const accepted = once(app.server, 'connection') as Promise<[Socket]>
  const client = connect({ port: Number(new URL(url).port), host: '127.0.0.1', allowHalfOpen: true })
  client.on('error', () => {}) // a cut socket is reset: that is what the linger tests look at
  t.teardown(() => client.destroy())
  const [server] = await accepted
  let text = ''
  client.setEncoding('latin1').on('data', (c: string) => { text += c })
  return { client, server, text: () => text }
}
