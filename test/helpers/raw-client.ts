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

/** A raw client of `url` that keeps what comes back until the close; what it writes is the caller's. */
export interface RawConnection {
  socket: Socket
  /** What came back so far. */
  received: () => string
  closed: Promise<void>
  /** Writes `data`, and waits until more may be written (or the connection is closed). */
  write: (data: Buffer | string) => Promise<void>
  /** The answer's head and body, once the connection is closed. */
  answer: () => Promise<[string, string]>
}

export async function rawConnection (t: Test, url: string): Promise<RawConnection> {
  const { hostname, port } = new URL(url)
  const socket = connect(Number(port), hostname)
  t.teardown(() => socket.destroy())
  await once(socket, 'connect')
  const chunks: Buffer[] = []
  socket.on('data', (c: Buffer) => chunks.push(c))
  // Not events.once for 'close' or 'drain': they would reject on an 'error', which is no failure here.
  socket.on('error', () => {})
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()))
  const received = (): string => Buffer.concat(chunks).toString('latin1')
  return {
    socket,
    received,
    closed,
    write: async (data) => {
      if (!socket.write(data)) await Promise.race([new Promise((resolve) => socket.once('drain', resolve)), closed])
    },
    answer: async () => {
      await closed
      const [head = '', text = ''] = received().split('\r\n\r\n')
      return [head, text]
    }
  }
}

/** `data` as one chunk of a chunked body. */
export function chunkOf (data: Buffer): Buffer {
  return Buffer.concat([Buffer.from(`${data.length.toString(16)}\r\n`), data, Buffer.from('\r\n')])
}
