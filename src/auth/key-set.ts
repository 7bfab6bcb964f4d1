/**
 * The identity provider's key set, cached whole (decision: tokens from an identity provider). jose's
 * `createRemoteJWKSet` is not used: during an outage every invented `kid` refetches, it ignores Cache-Control and
 * body size, and it cannot tell which keys left the set. A failed fetch keeps the cached keys, so an outage logs
 * nobody out.
 */
import { importJWK, type CryptoKey, type JWK } from 'jose'
import { request } from 'undici'
import type { KeySetMetrics } from '../observability/metrics.js'
import type { KeySetStatus } from '../observability/status.js'

/** HS* never: a set of public keys has no shared secret. */
const ASYMMETRIC = new Set([
  'RS256',
  'RS384',
  'RS512',
  'PS256',
  'PS384',
  'PS512',
  'ES256',
  'ES384',
  'ES512',
  'EdDSA',
  'Ed25519'
])

export interface SigningKey {
  readonly kid: string | undefined
  readonly alg: string
  readonly key: CryptoKey | Uint8Array
  /** As published, to tell an unchanged key from a replaced one on refresh. */
  readonly jwk: string
}

export interface KeySetOptions {
  url: string
  cooldownMs: number
  timeoutMs?: number
  maxBodyBytes?: number
  minMaxAgeMs?: number
  log?: { warn: (obj: object, msg: string) => void; info: (obj: object, msg: string) => void }
  metrics?: KeySetMetrics
}

/** With `retryAfterS` the provider could not be reached; without, the kid is unknown. */
export class KeyNotFound extends Error {
  override name = 'KeyNotFound'
  constructor (
    message: string,
    readonly retryAfterS?: number
  ) {
    super(message)
  }
}

const DEFAULT_MAX_AGE_MS = 10 * 60_000
const MIN_MAX_AGE_MS = 60_000
const MAX_MAX_AGE_MS = 24 * 3600_000

export function pinnedAlgorithm (jwk: JWK): string | undefined {
  if (jwk.use !== undefined && jwk.use !== 'sig') return undefined
  if (jwk.alg !== undefined) return ASYMMETRIC.has(jwk.alg) ? jwk.alg : undefined
  if (jwk.kty === 'RSA') return 'RS256'
  if (jwk.kty === 'EC' && jwk.crv === 'P-256') return 'ES256'
  if (jwk.kty === 'OKP' && jwk.crv === 'Ed25519') return 'EdDSA'
  return undefined
}

export function maxAgeMs (cacheControl: string | string[] | undefined, minMs = MIN_MAX_AGE_MS): number {
  const match = /(?:^|,)\s*max-age=(\d+)/i.exec(String(cacheControl ?? ''))
  if (match === null) return DEFAULT_MAX_AGE_MS
  return Math.min(MAX_MAX_AGE_MS, Math.max(minMs, Number(match[1]) * 1000))
}

export class KeySet {
  readonly url: string
  private readonly opts: Required<Omit<KeySetOptions, 'log' | 'metrics'>> & Pick<KeySetOptions, 'log' | 'metrics'>
  private keys: SigningKey[] = []
  private trusted = new Set<SigningKey>()
  private lastAttemptAt = -Infinity
  private lastOk = false
  private inFlight: Promise<void> | undefined
  private lastFetchedAt: number | undefined
  private nextFetchAt: number | undefined
  private timer: NodeJS.Timeout | undefined
  private closed = false

  constructor (opts: KeySetOptions) {
    this.url = opts.url
    this.opts = { timeoutMs: 5_000, maxBodyBytes: 256 * 1024, minMaxAgeMs: MIN_MAX_AGE_MS, ...opts }
  }

  trusts (key: SigningKey): boolean {
    return this.trusted.has(key)
  }

  /** Throws KeyNotFound. */
  async keyFor (kid: string | undefined): Promise<SigningKey> {
    let found = this.lookup(kid)
    if (found !== undefined) return found
    if (kid === undefined && this.keys.length > 1) {
      throw new KeyNotFound('token has no kid and the key set holds several keys')
    }
    if (this.inFlight !== undefined) await this.inFlight
    else if (Date.now() - this.lastAttemptAt >= this.opts.cooldownMs) await this.refresh()
    found = this.lookup(kid)
    if (found !== undefined) return found
    if (!this.lastOk) {
      const retryAfterS = Math.max(1, Math.ceil((this.lastAttemptAt + this.opts.cooldownMs - Date.now()) / 1000))
      this.opts.metrics?.keySetKeyUnavailable()
      throw new KeyNotFound('identity provider unavailable', retryAfterS)
    }
    throw new KeyNotFound(kid === undefined ? 'token has no kid' : 'token key is not in the key set')
  }

  private lookup (kid: string | undefined): SigningKey | undefined {
    if (kid === undefined) return this.keys.length === 1 ? this.keys[0] : undefined
    return this.keys.find((k) => k.kid === kid)
  }

  /** One fetch in flight at a time; never throws. */
  refresh (): Promise<void> {
    this.inFlight ??= this.fetchOnce().finally(() => {
      this.inFlight = undefined
    })
    return this.inFlight
  }

  get ready (): boolean {
    return this.lastOk
  }

  /** Never the keys' material, nor the URL, which may carry a token. */
  get status (): KeySetStatus {
    const iso = (ms: number | undefined): string | null =>
      ms === undefined || !Number.isFinite(ms) ? null : new Date(ms).toISOString()
    return {
      mode: 'jwks',
      keys: this.keys.length,
      kids: this.keys.map((k) => ({ kid: k.kid ?? null, alg: k.alg })),
      lastFetchOk: this.lastOk,
      lastAttempt: iso(this.lastAttemptAt),
      lastFetch: iso(this.lastFetchedAt),
      nextFetch: iso(this.nextFetchAt)
    }
  }

  close (): void {
    this.closed = true
    clearTimeout(this.timer)
  }

  private async fetchOnce (): Promise<void> {
    const started = Date.now()
    // The cooldown counts from any attempt's start, failed ones included, so an outage does not invite refetches.
    this.lastAttemptAt = started
    let nextInMs = this.opts.cooldownMs
    try {
      const { keys, maxAge } = await this.download()
      // A key whose JWK did not change keeps its identity, so tokens it verified stay cached.
      const previous = new Map(this.keys.map((k) => [JSON.stringify(k.kid) + k.alg, k]))
      this.keys = keys.map((k) => {
        const same = previous.get(JSON.stringify(k.kid) + k.alg)
        return same !== undefined && same.jwk === k.jwk ? same : k
      })
      this.trusted = new Set(this.keys)
      this.lastOk = true
      this.lastFetchedAt = Date.now()
      // Refreshed in the background before the provider's max-age runs out.
      nextInMs = Math.max(this.opts.cooldownMs, maxAge * 0.8)
      this.opts.log?.info({ url: this.url, keys: keys.length, ms: Date.now() - started }, 'key set fetched')
      this.opts.metrics?.keySetRefreshed(true)
    } catch (err) {
      this.lastOk = false
      const error = err instanceof Error ? err.message : String(err)
      this.opts.log?.warn(
        { url: this.url, error, cachedKeys: this.keys.length },
        'key set fetch failed; cached keys still used'
      )
      this.opts.metrics?.keySetRefreshed(false)
    }
    if (!this.closed) {
      clearTimeout(this.timer)
      this.timer = setTimeout(() => {
        void this.refresh()
      }, nextInMs).unref()
      this.nextFetchAt = Date.now() + nextInMs
    }
  }

  private async download (): Promise<{ keys: SigningKey[]; maxAge: number }> {
    const signal = AbortSignal.timeout(this.opts.timeoutMs)
    const res = await request(this.url, { signal, headers: { accept: 'application/json' } })
    if (res.statusCode !== 200) {
      res.body.resume()
      throw new Error(`key set answered HTTP ${res.statusCode}`)
    }
    const declared = Number(res.headers['content-length'] ?? 0)
    if (declared > this.opts.maxBodyBytes) {
      res.body.destroy()
      throw new Error(`key set is larger than ${this.opts.maxBodyBytes} bytes`)
    }
    const chunks: Buffer[] = []
    let size = 0
    for await (const chunk of res.body as AsyncIterable<Buffer>) {
      size += chunk.length
      if (size > this.opts.maxBodyBytes) {
        res.body.destroy()
        throw new Error(`key set is larger than ${this.opts.maxBodyBytes} bytes`)
      }
      chunks.push(chunk)
    }
    let body: unknown
    try {
      body = JSON.parse(Buffer.concat(chunks).toString('utf8'))
    } catch {
      throw new Error('key set is not JSON')
    }
    const jwks = (body as { keys?: unknown } | null)?.keys
    if (!Array.isArray(jwks)) throw new Error('key set has no "keys" array')
    const keys: SigningKey[] = []
    for (const jwk of jwks as JWK[]) {
      if (typeof jwk !== 'object' || jwk === null) continue
      const alg = pinnedAlgorithm(jwk)
      if (alg === undefined) continue // `use: enc`, `oct`, unknown curves and HS* are ignored
      try {
        keys.push({
          kid: typeof jwk.kid === 'string' ? jwk.kid : undefined,
          alg,
          key: await importJWK(jwk, alg),
          jwk: JSON.stringify(jwk)
        })
      } catch {
        // A malformed key is skipped; the others still work.
      }
    }
    if (keys.length === 0) throw new Error('key set holds no usable signing key')
    return { keys, maxAge: maxAgeMs(res.headers['cache-control'], this.opts.minMaxAgeMs) }
  }
}
