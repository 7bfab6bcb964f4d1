/**
 * A DNS server that does not answer (c-ares times out on it), and can be told
 * to start answering: from then on it relays every query to a real one
 * (deploy/local/dns.ts) and the answers back.
 */
import { createSocket, type Socket } from 'node:dgram'
import { once } from 'node:events'
import type { Test } from 'tap'
import type { DnsServer } from '../../deploy/local/dns.js'

export interface SilentDnsServer {
  /** host:port, as UPSTREAM_DNS_SERVERS takes it. */
  address: string
  socket: Socket
  /** Queries received while silent. */
  dropped: () => number
  /** Relay every later query to `dns`. */
  answerWith: (dns: DnsServer) => void
}

export async function silentDnsServer (t: Test): Promise<SilentDnsServer> {
  const socket = createSocket('udp4')
  socket.bind(0, '127.0.0.1')
  await once(socket, 'listening')
  t.teardown(() => socket.close())
  const clients = new Map<number, { port: number, address: string }>()
  let upstream: DnsServer | undefined
  let dropped = 0
  socket.on('message', (msg, peer) => {
    if (upstream === undefined) {
      dropped++
      return
    }
    if (peer.port === upstream.port && peer.address === upstream.host) {
      const back = clients.get(msg.readUInt16BE(0))
      if (back !== undefined) socket.send(msg, back.port, back.address)
      return
    }
    clients.set(msg.readUInt16BE(0), peer)
    socket.send(msg, upstream.port, upstream.host)
  })
  return { address: `127.0.0.1:${socket.address().port}`, socket, dropped: () => dropped, answerWith: (dns) => { upstream = dns } }
}
