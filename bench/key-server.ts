/**
 * A key server for the key-set scenarios: a JSON Web Key Set (RFC 7517) on
 * loopback, and tokens signed with its private key. It runs inside the
 * harness process because the gateway fetches the set once and caches it
 * (DECISIONS: keys cached, refetched only on an unknown `kid`), so it serves
 * a handful of requests per run and cannot disturb the measurement.
 */
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { exportJWK, generateKeyPair, SignJWT } from 'jose'

export const KEY_SET_ISSUER = 'https://bench-issuer.invalid'
export const KEY_SET_AUDIENCE = 'portfolio-gateway'
/** RS256: what most OpenID providers sign with. */
const ALGORITHM = 'RS256'
const KID = 'bench-key-1'

export interface KeyServer {
  /** The JWKS document's URL, for JWT_JWKS_URL. */
  jwksUrl: string
  /** How many times the set was fetched: a cache that works keeps this small. */
  fetches: () => number
  sign: (sub: string, lifetimeSeconds?: number) => Promise<string>
  close: () => Promise<void>
}

export async function startKeyServer (): Promise<KeyServer> {
  const { publicKey, privateKey } = await generateKeyPair(ALGORITHM, { extractable: true })
  const jwk = { ...await exportJWK(publicKey), kid: KID, alg: ALGORITHM, use: 'sig' }
  const document = JSON.stringify({ keys: [jwk] })
  let fetches = 0
  const server = createServer((req, res) => {
    if (req.url !== '/.well-known/jwks.json') {
      res.writeHead(404).end()
      return
    }
    fetches++
    res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'max-age=300' }).end(document)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as AddressInfo
  return {
    jwksUrl: `http://127.0.0.1:${port}/.well-known/jwks.json`,
    fetches: () => fetches,
    sign: async (sub, lifetimeSeconds = 3600) => await new SignJWT({})
      .setProtectedHeader({ alg: ALGORITHM, kid: KID, typ: 'JWT' })
      .setSubject(sub)
      .setIssuer(KEY_SET_ISSUER)
      .setAudience(KEY_SET_AUDIENCE)
      .setIssuedAt()
      .setExpirationTime(`${lifetimeSeconds}s`)
      .sign(privateKey),
    close: async () => await new Promise<void>((resolve) => {
      server.closeAllConnections()
      server.close(() => resolve())
    })
  }
}
