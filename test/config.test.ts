/**
 * The environment -> config contract (DECISIONS "Configuration"): defaults,
 * every variable, and one exact, one-line message for every bad value.
 */
import { generateKeyPairSync } from 'node:crypto'
import t from 'tap'
import { ConfigError, loadConfig } from '../src/config.js'
import { keyPair, SECRET } from './helpers/app.js'

t.test('defaults: nothing set is a development gateway with the embedded engine', async (t) => {
  const config = loadConfig({})
  t.same({ ...config, jwt: undefined }, {
    production: false,
    port: 3000,
    host: '0.0.0.0',
    logLevel: 'info',
    jwt: undefined,
    upstreamTimeoutMs: 10_000,
    upstreamTryTimeoutMs: 3333,
    upstreamDnsRefreshMs: 5000,
    metricsPort: 9464,
    limits: { ratePerMinute: 600, idempotencyTtlS: 86_400, shedEventLoopDelayMs: 200, upstreamMaxQueue: 256 },
    uploads: { maxPerUser: 2, maxConnections: 32 },
    linger: { bodyFactor: 2, maxSockets: 1024, maxPerAddress: 16 },
    workers: 1
  })
  t.ok(Object.isFrozen(config.limits), 'limits frozen')
  t.notOk('upstreamUrl' in config, 'no UPSTREAM_URL: embedded engine')
  t.ok(Object.isFrozen(config) && Object.isFrozen(config.jwt), 'frozen')
})

t.test('each variable is read', async (t) => {
  const config = loadConfig({
    NODE_ENV: 'production',
    PORT: '8080',
    HOST: '127.0.0.1',
    LOG_LEVEL: 'debug',
    JWT_SECRET: SECRET,
    JWT_ISSUER: 'https://issuer.example',
    JWT_AUDIENCE: 'portfolio',
    UPSTREAM_URL: 'http://engine:4000/',
    UPSTREAM_TIMEOUT_MS: '2500',
    METRICS_PORT: '9100',
    RATE_LIMIT_PER_MINUTE: '0',
    REDIS_URL: 'redis://:pw@redis:6379/2',
    IDEMPOTENCY_TTL_S: '3600',
    SHED_EVENT_LOOP_DELAY_MS: '0',
    UPSTREAM_MAX_QUEUE: '16',
    UPLOAD_MAX_PER_USER: '3',
    UPLOAD_MAX_CONNECTIONS: '16',
    UPSTREAM_DNS_REFRESH_MS: '2000',
    LINGER_BODY_FACTOR: '3',
    LINGER_MAX_SOCKETS: '64',
    LINGER_MAX_PER_ADDRESS: '4',
    GATEWAY_WORKERS: '2'
  })
  t.same(config, {
    production: true,
    port: 8080,
    host: '127.0.0.1',
    logLevel: 'debug',
    jwt: { source: 'static', clockToleranceS: 5, key: SECRET, algorithm: 'HS256', generated: false, issuer: 'https://issuer.example', audience: 'portfolio' },
    upstreamUrl: 'http://engine:4000',
    upstreamUrls: ['http://engine:4000'],
    upstreamTimeoutMs: 2500,
    upstreamTryTimeoutMs: 833,
    upstreamDnsRefreshMs: 2000,
    metricsPort: 9100,
    limits: { ratePerMinute: 0, redis: { mode: 'single', url: 'redis://:pw@redis:6379/2' }, idempotencyTtlS: 3600, shedEventLoopDelayMs: 0, upstreamMaxQueue: 16 },
    uploads: { maxPerUser: 3, maxConnections: 16 },
    linger: { bodyFactor: 3, maxSockets: 64, maxPerAddress: 4 },
    workers: 2
  })
  t.equal(loadConfig({ METRICS_PORT: '0' }).metricsPort, 0, 'METRICS_PORT=0 turns metrics off')
  t.equal(loadConfig({ PORT: '0' }).port, 0, 'PORT=0 (any free port) is allowed')
  t.equal(loadConfig({ UPSTREAM_URL: 'https://engine.internal' }).upstreamUrl, 'https://engine.internal')
})

t.test('UPSTREAM_URL as a list: every endpoint, in order (DECISIONS 24); UPSTREAM_TRY_TIMEOUT_MS', async (t) => {
  const config = loadConfig({ UPSTREAM_URL: 'http://engine-a:4000, http://engine-b:4000/,https://10.0.0.7', UPSTREAM_TIMEOUT_MS: '3000', UPSTREAM_TRY_TIMEOUT_MS: '500' })
  t.same(config.upstreamUrls, ['http://engine-a:4000', 'http://engine-b:4000', 'https://10.0.0.7'])
  t.equal(config.upstreamUrl, 'http://engine-a:4000', 'the first, for what needs one URL')
  t.equal(config.upstreamTryTimeoutMs, 500)
  t.equal(loadConfig({ UPSTREAM_TIMEOUT_MS: '3000' }).upstreamTryTimeoutMs, 1000, 'a third of UPSTREAM_TIMEOUT_MS by default')
  t.ok(Object.isFrozen(config.upstreamUrls))
})

const BAD: Array<[Record<string, string>, string]> = [
  [{ UPSTREAM_URL: 'http://a:4000,http://a:4000/' }, 'UPSTREAM_URL lists http://a:4000 twice: each engine endpoint once, comma-separated, e.g. http://engine-a:4000,http://engine-b:4000'],
  [{ UPSTREAM_URL: 'http://a:4000,' }, 'UPSTREAM_URL="http://a:4000," is invalid: does not have the expected form; expected base URL of the engine, http(s)://host:port with no path; several, comma-separated, for several engine instances'],
  [{ UPSTREAM_URL: 'http://a:4000,http://b:99999' }, 'UPSTREAM_URL="http://b:99999" is invalid: port 99999 is out of range; use a port from 1 to 65535, or none for 80/443'],
  [{ UPSTREAM_TIMEOUT_MS: '1000', UPSTREAM_TRY_TIMEOUT_MS: '2000' }, 'UPSTREAM_TRY_TIMEOUT_MS=2000 is longer than UPSTREAM_TIMEOUT_MS=1000: one try lives within the call\'s deadline; set it lower, or leave it unset for a third'],
  [{ UPSTREAM_TRY_TIMEOUT_MS: '0' }, 'UPSTREAM_TRY_TIMEOUT_MS="0" is invalid: must be between 1 and 600000; expected how long one try of a GET to the engine may wait for headers before it is retried on another endpoint, in ms; default a third of UPSTREAM_TIMEOUT_MS'],
  [{ UPSTREAM_DNS_REFRESH_MS: '50' }, 'UPSTREAM_DNS_REFRESH_MS="50" is invalid: must be between 100 and 3600000; expected how often the host names in UPSTREAM_URL are resolved again, in ms (Envoy\'s default, 5000); a name is also resolved at once when an endpoint becomes unreachable'],
  [{ UPSTREAM_DNS_REFRESH_MS: '5s' }, 'UPSTREAM_DNS_REFRESH_MS="5s" is invalid: must be a whole number; expected how often the host names in UPSTREAM_URL are resolved again, in ms (Envoy\'s default, 5000); a name is also resolved at once when an endpoint becomes unreachable'],
  [{ UPSTREAM_DNS_REFRESH_MS: '3600001' }, 'UPSTREAM_DNS_REFRESH_MS="3600001" is invalid: must be between 100 and 3600000; expected how often the host names in UPSTREAM_URL are resolved again, in ms (Envoy\'s default, 5000); a name is also resolved at once when an endpoint becomes unreachable'],
  [{ PORT: 'abc' }, 'PORT="abc" is invalid: must be a whole number; expected listen port'],
  [{ PORT: '70000' }, 'PORT="70000" is invalid: must be between 0 and 65535; expected listen port'],
  [{ PORT: '4e3' }, 'PORT="4e3" is invalid: must be a whole number; expected listen port'],
  [{ PORT: '40.5' }, 'PORT="40.5" is invalid: must be a whole number; expected listen port'],
  [{ PORT: '-1' }, 'PORT="-1" is invalid: must be a whole number; expected listen port'],
  [{ PORT: ' 3000' }, 'PORT=" 3000" is invalid: must be a whole number; expected listen port'],
  [{ LOG_LEVEL: 'loud' }, 'LOG_LEVEL="loud" is invalid: must be one of fatal, error, warn, info, debug, trace, silent; expected pino level'],
  [{ UPSTREAM_URL: 'ftp://x' }, 'UPSTREAM_URL="ftp://x" is invalid: does not have the expected form; expected base URL of the engine, http(s)://host:port with no path; several, comma-separated, for several engine instances'],
  [{ UPSTREAM_URL: 'http://host/path' }, 'UPSTREAM_URL="http://host/path" is invalid: does not have the expected form; expected base URL of the engine, http(s)://host:port with no path; several, comma-separated, for several engine instances'],
  [{ UPSTREAM_TIMEOUT_MS: '0' }, 'UPSTREAM_TIMEOUT_MS="0" is invalid: must be between 1 and 600000; expected how long to wait for the engine response headers, in ms'],
  [{ UPSTREAM_TIMEOUT_MS: '1.5' }, 'UPSTREAM_TIMEOUT_MS="1.5" is invalid: must be a whole number; expected how long to wait for the engine response headers, in ms'],
  [{ METRICS_PORT: '70000' }, 'METRICS_PORT="70000" is invalid: must be between 0 and 65535; expected port of the Prometheus /metrics listener on HOST, 0 for none'],
  [{ METRICS_PORT: 'off' }, 'METRICS_PORT="off" is invalid: must be a whole number; expected port of the Prometheus /metrics listener on HOST, 0 for none'],
  [{ RATE_LIMIT_PER_MINUTE: '-5' }, 'RATE_LIMIT_PER_MINUTE="-5" is invalid: must be a whole number; expected requests per user (token sub) per 60 s on /api/*, 0 turns the limit off'],
  [{ REDIS_URL: 'localhost:6379' }, 'REDIS_URL=(hidden) is invalid: does not have the expected form; expected redis://[user:password@]host:port[/db] for shared rate limits and idempotency records'],
  [{ IDEMPOTENCY_TTL_S: '0' }, 'IDEMPOTENCY_TTL_S="0" is invalid: must be between 1 and 2592000; expected how long an Idempotency-Key record is kept, in seconds'],
  [{ SHED_EVENT_LOOP_DELAY_MS: '1.5' }, 'SHED_EVENT_LOOP_DELAY_MS="1.5" is invalid: must be a whole number; expected event loop delay past which new /api/* requests get 503, in ms; 0 turns it off'],
  [{ UPSTREAM_MAX_QUEUE: '0' }, 'UPSTREAM_MAX_QUEUE="0" is invalid: must be between 1 and 100000; expected requests that may wait for an engine connection; past it new /api/* requests get 503'],
  [{ UPLOAD_MAX_PER_USER: '0' }, 'UPLOAD_MAX_PER_USER="0" is invalid: must be between 1 and 1000; expected creates one user (token sub) may have in progress at once; one more gets 429'],
  [{ UPLOAD_MAX_CONNECTIONS: '128' }, 'UPLOAD_MAX_CONNECTIONS="128" is invalid: must be between 1 and 127; expected engine connections per engine endpoint that streaming creates may hold together (of 128); past it a create waits, then 503'],
  [{ LINGER_BODY_FACTOR: '0' },
    'LINGER_BODY_FACTOR="0" is invalid: must be between 1 and 16; expected a refused body declared at most this many ' +
    'times the route\'s body limit (create: 10 MiB) is read and thrown away while the client keeps up the uploads\' ' +
    'minimum rate; a larger one is closed after the answer'],
  [{ LINGER_MAX_SOCKETS: 'many' },
    'LINGER_MAX_SOCKETS="many" is invalid: must be a whole number; expected connections that may read the rest of a ' +
    'refused body at once; one more cuts, of the addresses that hold the most, the linger with the most time left ' +
    'to its end'],
  [{ LINGER_MAX_SOCKETS: '8', LINGER_MAX_PER_ADDRESS: '9' },
    'LINGER_MAX_PER_ADDRESS=9 is more than LINGER_MAX_SOCKETS=8: one address cannot have more lingering connections ' +
    'than all of them; set it at most 8'],
  [{ JWT_SECRET: 'x'.repeat(31) }, 'JWT_SECRET=(hidden) is invalid: must be at least 32 characters; expected HS256 secret, e.g. the output of openssl rand -hex 32']
]

for (const [env, message] of BAD) {
  t.test(`bad value ${JSON.stringify(env)}`, async (t) => {
    const before = { ...env }
    t.throws(() => loadConfig(env), new ConfigError(message))
    t.throws(() => loadConfig(env), ConfigError)
    t.notMatch(message, /\n/, 'one line')
    t.same(env, before, 'the environment is not changed')
  })
}

t.test('a short JWT_SECRET is never shown', async (t) => {
  const secret = 'hunter2-hunter2'
  const err = t.throws(() => loadConfig({ JWT_SECRET: secret, JWT_AUDIENCE: 'portfolio' }), ConfigError)
  t.notMatch(String((err as Error).message), secret)
})

t.test('production without a key refuses to start', async (t) => {
  t.throws(() => loadConfig({ NODE_ENV: 'production' }), new ConfigError(
    'NODE_ENV=production needs a JWT key: set JWT_SECRET (HS256, 32+ characters), JWT_PUBLIC_KEY (PEM, RS256/ES256) or JWT_JWKS_URL (your identity provider)'
  ))
})

t.test('development without a key generates a secret', async (t) => {
  const a = loadConfig({})
  const b = loadConfig({ NODE_ENV: 'development' })
  if (a.jwt.source !== 'static' || b.jwt.source !== 'static') throw new Error('expected a static key')
  t.equal(a.jwt.generated, true)
  t.equal(a.jwt.algorithm, 'HS256')
  t.ok(a.jwt.key.length >= 32, 'as long as a configured secret must be')
  t.not(a.jwt.key, b.jwt.key, 'random each time')
})

t.test('JWT_SECRET and JWT_PUBLIC_KEY both set', async (t) => {
  t.throws(() => loadConfig({ JWT_SECRET: SECRET, JWT_PUBLIC_KEY: keyPair('rsa').publicKey }), new ConfigError(
    'JWT_SECRET and JWT_PUBLIC_KEY are both set: set exactly one key source (JWT_SECRET, JWT_PUBLIC_KEY or JWT_JWKS_URL)'
  ))
})

const JWKS = { JWT_JWKS_URL: 'https://id.example/.well-known/jwks.json', JWT_ISSUER: 'https://id.example/' }

t.test('JWT_JWKS_URL: the key set, with its cooldown and the clock tolerance (DECISIONS 13)', async (t) => {
  t.same(loadConfig(JWKS).jwt, {
    source: 'jwks', jwksUrl: JWKS.JWT_JWKS_URL, jwksCooldownS: 30, generated: false, issuer: 'https://id.example/', clockToleranceS: 5
  }, 'defaults: cooldown 30 s, tolerance 5 s')
  t.same(loadConfig({ ...JWKS, JWT_AUDIENCE: 'portfolio', JWT_JWKS_COOLDOWN_S: '60', JWT_CLOCK_TOLERANCE_S: '0', NODE_ENV: 'production', UPSTREAM_URL: 'http://engine:4000' }).jwt, {
    source: 'jwks', jwksUrl: JWKS.JWT_JWKS_URL, jwksCooldownS: 60, generated: false, issuer: 'https://id.example/', audience: 'portfolio', clockToleranceS: 0
  })
  t.equal(loadConfig({ JWT_SECRET: SECRET, JWT_CLOCK_TOLERANCE_S: '30' }).jwt.clockToleranceS, 30, 'the tolerance applies to static keys too')
  const production = { ...JWKS, JWT_AUDIENCE: 'portfolio', NODE_ENV: 'production', UPSTREAM_URL: 'http://engine:4000' }
  for (const url of ['http://127.0.0.1:8443/jwks', 'http://localhost/jwks', 'http://[::1]:9000/jwks']) {
    t.equal(loadConfig({ ...production, JWT_JWKS_URL: url }).jwt.source, 'jwks', `production: plain http only to this machine (${url})`)
  }
  t.equal(loadConfig({ ...JWKS, JWT_JWKS_URL: 'http://id.internal/jwks' }).jwt.source, 'jwks', 'outside production plain http is allowed (tests, a local provider)')
})

t.test('JWT_JWKS_URL mistakes: one line naming the variable', async (t) => {
  const cases: Array<[Record<string, string>, string]> = [
    [{ JWT_JWKS_URL: JWKS.JWT_JWKS_URL }, "JWT_ISSUER is required with JWT_JWKS_URL: set it to the provider's issuer, the `iss` of its tokens"],
    [{ ...JWKS, NODE_ENV: 'production', UPSTREAM_URL: 'http://engine:4000' }, 'JWT_AUDIENCE is required with JWT_JWKS_URL in production: set it to the API identifier your provider puts in `aud`'],
    [{ ...JWKS, JWT_AUDIENCE: 'portfolio', JWT_JWKS_URL: 'http://id.example/jwks', NODE_ENV: 'production', UPSTREAM_URL: 'http://engine:4000' }, "JWT_JWKS_URL must be https in production: a key set fetched over plain http can be replaced on the way, and with it every token; use the provider's https URL (or a TLS proxy on 127.0.0.1)"],
    [{ ...JWKS, JWT_AUDIENCE: 'portfolio', JWT_JWKS_URL: 'http://127.0.0.1.example/jwks', NODE_ENV: 'production', UPSTREAM_URL: 'http://engine:4000' }, "JWT_JWKS_URL must be https in production: a key set fetched over plain http can be replaced on the way, and with it every token; use the provider's https URL (or a TLS proxy on 127.0.0.1)"],
    [{ ...JWKS, JWT_SECRET: SECRET }, 'JWT_SECRET and JWT_JWKS_URL are both set: set exactly one key source (JWT_SECRET, JWT_PUBLIC_KEY or JWT_JWKS_URL)'],
    [{ ...JWKS, JWT_SECRET: SECRET, JWT_PUBLIC_KEY: keyPair('ec').publicKey }, 'JWT_SECRET and JWT_PUBLIC_KEY and JWT_JWKS_URL are all set: set exactly one key source (JWT_SECRET, JWT_PUBLIC_KEY or JWT_JWKS_URL)'],
    [{ ...JWKS, JWT_JWKS_URL: 'id.example/jwks' }, "JWT_JWKS_URL=(hidden) is invalid: does not have the expected form; expected the identity provider's JSON Web Key Set, an http(s) URL"],
    [{ ...JWKS, JWT_JWKS_COOLDOWN_S: '0' }, 'JWT_JWKS_COOLDOWN_S=(hidden) is invalid: must be between 1 and 3600; expected seconds between key-set refetches caused by an unknown kid'],
    [{ ...JWKS, JWT_CLOCK_TOLERANCE_S: '1.5' }, 'JWT_CLOCK_TOLERANCE_S=(hidden) is invalid: must be a whole number; expected seconds of clock drift allowed when checking exp and nbf']
  ]
  for (const [env, message] of cases) t.throws(() => loadConfig(env), new ConfigError(message), message.split(' ')[0] ?? message)
})

t.test('JWT_PUBLIC_KEY pins the algorithm by key type', async (t) => {
  const rsa = keyPair('rsa').publicKey
  const ec = keyPair('ec').publicKey
  t.same(loadConfig({ JWT_PUBLIC_KEY: rsa }).jwt, { source: 'static', clockToleranceS: 5, key: rsa, algorithm: 'RS256', generated: false })
  t.same(loadConfig({ JWT_PUBLIC_KEY: ec }).jwt, { source: 'static', clockToleranceS: 5, key: ec, algorithm: 'ES256', generated: false })

  const ed25519 = generateKeyPairSync('ed25519', { publicKeyEncoding: { type: 'spki', format: 'pem' }, privateKeyEncoding: { type: 'pkcs8', format: 'pem' } }).publicKey
  t.throws(() => loadConfig({ JWT_PUBLIC_KEY: ed25519 }), new ConfigError(
    'JWT_PUBLIC_KEY is a key of type ed25519: use an RSA key (RS256) or a P-256 EC key (ES256)'
  ))
  const p384 = generateKeyPairSync('ec', { namedCurve: 'secp384r1', publicKeyEncoding: { type: 'spki', format: 'pem' }, privateKeyEncoding: { type: 'pkcs8', format: 'pem' } }).publicKey
  t.throws(() => loadConfig({ JWT_PUBLIC_KEY: p384 }), new ConfigError(
    'JWT_PUBLIC_KEY is an EC key on curve secp384r1: use an RSA key (RS256) or a P-256 EC key (ES256)'
  ), 'an EC key on another curve is refused too')

  t.throws(() => loadConfig({ JWT_PUBLIC_KEY: 'not a key' }), new ConfigError(
    'JWT_PUBLIC_KEY is not a PEM public key: pass the text of the key, starting with -----BEGIN PUBLIC KEY-----'
  ))
})

t.test('a PEM on one line with literal \\n works', async (t) => {
  const pem = keyPair('ec').publicKey
  const oneLine = pem.replace(/\n/g, '\\n')
  t.notMatch(oneLine, /\n/)
  t.same(loadConfig({ JWT_PUBLIC_KEY: oneLine }).jwt, { source: 'static', clockToleranceS: 5, key: pem, algorithm: 'ES256', generated: false })
})

t.test('an empty variable counts as unset', async (t) => {
  const config = loadConfig({
    NODE_ENV: '',
    PORT: '',
    HOST: '',
    LOG_LEVEL: '',
    JWT_SECRET: '',
    JWT_PUBLIC_KEY: '',
    JWT_ISSUER: '',
    JWT_AUDIENCE: '',
    UPSTREAM_URL: '',
    UPSTREAM_TIMEOUT_MS: '',
    METRICS_PORT: '',
    RATE_LIMIT_PER_MINUTE: '',
    REDIS_URL: '',
    IDEMPOTENCY_TTL_S: '',
    SHED_EVENT_LOOP_DELAY_MS: '',
    UPSTREAM_MAX_QUEUE: '',
    UPLOAD_MAX_PER_USER: '',
    UPLOAD_MAX_CONNECTIONS: '',
    UPSTREAM_DNS_REFRESH_MS: '',
    GATEWAY_WORKERS: '',
    LINGER_BODY_FACTOR: '',
    LINGER_MAX_SOCKETS: '',
    LINGER_MAX_PER_ADDRESS: ''
  })
  t.same({ ...config, jwt: { ...config.jwt, key: undefined } }, {
    production: false,
    port: 3000,
    host: '0.0.0.0',
    logLevel: 'info',
    jwt: { source: 'static', clockToleranceS: 5, key: undefined, algorithm: 'HS256', generated: true },
    upstreamTimeoutMs: 10_000,
    upstreamTryTimeoutMs: 3333,
    upstreamDnsRefreshMs: 5000,
    metricsPort: 9464,
    limits: { ratePerMinute: 600, idempotencyTtlS: 86_400, shedEventLoopDelayMs: 200, upstreamMaxQueue: 256 },
    uploads: { maxPerUser: 2, maxConnections: 32 },
    linger: { bodyFactor: 2, maxSockets: 1024, maxPerAddress: 16 },
    workers: 1
  })
  t.throws(() => loadConfig({ NODE_ENV: 'production', JWT_SECRET: '' }), ConfigError, 'an empty secret is no key')
})

t.test('NODE_ENV must be a known mode: a typo does not silently run as development', async (t) => {
  t.throws(() => loadConfig({ NODE_ENV: 'prod', JWT_SECRET: SECRET }), new ConfigError(
    'NODE_ENV="prod" is invalid: must be one of development, production, test; expected development, production or test; production refuses to start without a JWT key or UPSTREAM_URL'
  ))
})

t.test('UPSTREAM_URL: a port the URL parser refuses is a config error, not a stack trace from new Pool', async (t) => {
  t.throws(() => loadConfig({ UPSTREAM_URL: 'http://h:99999' }), new ConfigError(
    'UPSTREAM_URL="http://h:99999" is invalid: port 99999 is out of range; use a port from 1 to 65535, or none for 80/443'
  ))
  t.throws(() => loadConfig({ UPSTREAM_URL: 'http://h:0/' }), new ConfigError(
    'UPSTREAM_URL="http://h:0/" is invalid: port 0 is out of range; use a port from 1 to 65535, or none for 80/443'
  ))
  t.throws(() => loadConfig({ UPSTREAM_URL: 'http://a b' }), new ConfigError(
    'UPSTREAM_URL="http://a b" is invalid: does not have the expected form; expected base URL of the engine, http(s)://host:port with no path'
  ))
  t.throws(() => loadConfig({ UPSTREAM_URL: 'http://[::1' }), new ConfigError(
    'UPSTREAM_URL="http://[::1" is invalid: not a URL; expected base URL of the engine, http(s)://host:port with no path'
  ))
  t.equal(loadConfig({ UPSTREAM_URL: 'http://engine:65535' }).upstreamUrl, 'http://engine:65535')
  t.equal(loadConfig({ UPSTREAM_URL: 'http://[::1]:4000/' }).upstreamUrl, 'http://[::1]:4000', 'IPv6 literal')
  t.equal(loadConfig({ UPSTREAM_URL: 'http://Engine.Internal:80' }).upstreamUrl, 'http://engine.internal', 'as the URL parser reads it')
})

t.test('UPSTREAM_URL with user:password@ is refused without echoing the password', async (t) => {
  const message = 'UPSTREAM_URL must not hold credentials (user:password@): the URL is logged; remove them and let the network or a proxy authenticate the gateway'
  for (const url of ['http://admin:s3cret-pw@engine:4000', 'http://s3cret-pw@engine', 'https://admin:s3cret-pw@engine.internal/']) {
    const err = t.throws(() => loadConfig({ UPSTREAM_URL: url }), new ConfigError(message), url) as Error
    t.notMatch(err.message, 's3cret-pw')
  }
  // Refused by the form check first (a path): the message quotes the URL, credentials hidden.
  const err = t.throws(() => loadConfig({ UPSTREAM_URL: 'http://admin:s3cret-pw@engine/api' }), new ConfigError(
    'UPSTREAM_URL="http://(credentials hidden)@engine/api" is invalid: does not have the expected form; expected base URL of the engine, http(s)://host:port with no path'
  )) as Error
  t.notMatch(err.message, 's3cret-pw')
})

t.test('a private key given as JWT_PUBLIC_KEY is refused: pass the public key', async (t) => {
  const message = 'JWT_PUBLIC_KEY holds a private key: pass the public key (-----BEGIN PUBLIC KEY-----, e.g. from openssl pkey -in key.pem -pubout) and keep the private key with the token issuer'
  for (const type of ['rsa', 'ec'] as const) {
    const { privateKey } = keyPair(type)
    t.throws(() => loadConfig({ JWT_PUBLIC_KEY: privateKey }), new ConfigError(message), `${type} PKCS#8`)
    t.throws(() => loadConfig({ JWT_PUBLIC_KEY: privateKey.replace(/\n/g, '\\n') }), new ConfigError(message), `${type} on one line`)
  }
  const pkcs1 = generateKeyPairSync('rsa', { modulusLength: 2048, publicKeyEncoding: { type: 'pkcs1', format: 'pem' }, privateKeyEncoding: { type: 'pkcs1', format: 'pem' } }).privateKey
  t.throws(() => loadConfig({ JWT_PUBLIC_KEY: pkcs1 }), new ConfigError(message), 'RSA PKCS#1 (BEGIN RSA PRIVATE KEY)')
})

t.test('NODE_ENV=production without UPSTREAM_URL is refused (DECISIONS 20)', async (t) => {
  t.throws(() => loadConfig({ NODE_ENV: 'production', JWT_SECRET: SECRET }), new ConfigError(
    "NODE_ENV=production needs UPSTREAM_URL: set it to the engine's base URL, e.g. http://engine:4000 (the embedded engine keeps data in memory)"
  ))
  t.equal(loadConfig({ NODE_ENV: 'production', JWT_SECRET: SECRET, UPSTREAM_URL: 'http://engine:4000' }).upstreamUrl, 'http://engine:4000')
  t.notOk('upstreamUrl' in loadConfig({ NODE_ENV: 'test', JWT_SECRET: SECRET }), 'test and development may use the embedded engine')
})

t.test('METRICS_PORT never shares the public port', async (t) => {
  t.throws(() => loadConfig({ PORT: '8080', METRICS_PORT: '8080' }), new ConfigError(
    'METRICS_PORT=8080 is also PORT: metrics never share the public port; pick another port, or 0 to turn metrics off'))
  t.equal(loadConfig({ PORT: '0', METRICS_PORT: '0' }).metricsPort, 0, 'both 0 is fine: 0 is "any free port" and "off"')
})

t.test('TRUST_PROXY: addresses and CIDRs, IPv4 and IPv6; a bad entry stops config with one line', async (t) => {
  t.notOk('trustProxy' in loadConfig({}), 'unset: no proxy is trusted')
  t.same(loadConfig({ TRUST_PROXY: '10.0.0.0/8, 192.168.1.10,fd00::/8,::1' }).trustProxy, ['10.0.0.0/8', '192.168.1.10', 'fd00::/8', '::1'])
  const expected = 'expected comma-separated addresses or CIDRs of the load balancers, e.g. 10.0.0.0/8,fd00::/8'
  const cases: Array<[string, string]> = [
    ['10.0.0.300', '"10.0.0.300"'],
    ['10.0.0.0/33', '"10.0.0.0/33"'],
    ['fd00::/129', '"fd00::/129"'],
    ['10.0.0.1,', '""'],
    ['haproxy', '"haproxy"'],
    ['10.0.0.0/8/8', '"10.0.0.0/8/8"']
  ]
  for (const [value, entry] of cases) {
    t.throws(() => loadConfig({ TRUST_PROXY: value }), new ConfigError(`TRUST_PROXY=${JSON.stringify(value)} is invalid: ${entry} is not an IP address or CIDR; ${expected}`), value)
  }
})

// (DECISIONS 26) exactly one Redis mode, and one line for every bad combination.
t.test('Redis: REDIS_URL, REDIS_SENTINELS + REDIS_SENTINEL_NAME or REDIS_CLUSTER_NODES, each read', async (t) => {
  t.same(loadConfig({ REDIS_URL: 'rediss://cache.example:6380' }).limits.redis, { mode: 'single', url: 'rediss://cache.example:6380' })
  t.same(loadConfig({ REDIS_SENTINELS: 's1:26379,10.0.0.2:26380,[::1]:26381', REDIS_SENTINEL_NAME: 'gateway', REDIS_USERNAME: 'gw', REDIS_PASSWORD: 'data-pw', REDIS_SENTINEL_PASSWORD: 'sentinel-pw' }).limits.redis, {
    mode: 'sentinel',
    sentinels: [{ host: 's1', port: 26379 }, { host: '10.0.0.2', port: 26380 }, { host: '::1', port: 26381 }],
    name: 'gateway',
    username: 'gw',
    password: 'data-pw',
    sentinelPassword: 'sentinel-pw'
  })
  t.same(loadConfig({ REDIS_CLUSTER_NODES: 'n1:7000,n2:7001', REDIS_PASSWORD: 'data-pw' }).limits.redis, {
    mode: 'cluster', nodes: [{ host: 'n1', port: 7000 }, { host: 'n2', port: 7001 }], password: 'data-pw'
  })
  t.notOk('redis' in loadConfig({}).limits, 'none: state in the process')
})

t.test('Redis: REDIS_TLS_CA is read at start, for any mode', async (t) => {
  const { mkdtempSync, writeFileSync, rmSync } = await import('node:fs')
  const { spawnSync } = await import('node:child_process')
  const { tmpdir } = await import('node:os')
  const { join } = await import('node:path')
  const dir = mkdtempSync(join(tmpdir(), 'redis-ca-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const ca = join(dir, 'ca.pem')
  const made = spawnSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', join(dir, 'ca.key'), '-out', ca, '-days', '1', '-subj', '/CN=test-ca'], { stdio: 'ignore' })
  t.equal(made.status, 0, 'openssl made a CA')
  const pem = (await import('node:fs')).readFileSync(ca, 'utf8')
  t.same(loadConfig({ REDIS_URL: 'rediss://127.0.0.1:6380', REDIS_TLS_CA: ca }).limits.redis, { mode: 'single', url: 'rediss://127.0.0.1:6380', tlsCa: pem })
  t.same(loadConfig({ REDIS_CLUSTER_NODES: 'n1:7000', REDIS_TLS_CA: ca }).limits.redis, { mode: 'cluster', nodes: [{ host: 'n1', port: 7000 }], tlsCa: pem })
  t.equal((loadConfig({ REDIS_SENTINELS: 's:1', REDIS_SENTINEL_NAME: 'm', REDIS_TLS_CA: ca }).limits.redis as { tlsCa?: string }).tlsCa, pem)

  t.throws(() => loadConfig({ REDIS_URL: 'rediss://h:6380', REDIS_TLS_CA: join(dir, 'missing.pem') }), new ConfigError(
    `REDIS_TLS_CA=${JSON.stringify(join(dir, 'missing.pem'))} cannot be read (ENOENT): give the path of a PEM file with the CA certificate that signed Redis's certificate`))
  const notPem = join(dir, 'not.pem')
  writeFileSync(notPem, 'hello')
  t.throws(() => loadConfig({ REDIS_URL: 'rediss://h:6380', REDIS_TLS_CA: notPem }), new ConfigError(
    `REDIS_TLS_CA=${JSON.stringify(notPem)} holds no PEM certificate: give the CA certificate (-----BEGIN CERTIFICATE-----) that signed Redis's certificate`))
  t.throws(() => loadConfig({ REDIS_URL: 'redis://h:6379', REDIS_TLS_CA: ca }), new ConfigError(
    'REDIS_TLS_CA is set but REDIS_URL is redis:// (plain): write rediss:// to connect with TLS, or unset REDIS_TLS_CA'))
})

const ONE_REDIS = 'set exactly one of REDIS_URL (one server), REDIS_SENTINELS with REDIS_SENTINEL_NAME (Sentinel) or REDIS_CLUSTER_NODES (Redis Cluster)'
const BAD_REDIS: Array<[Record<string, string>, string]> = [
  [{ REDIS_URL: 'redis://h:1', REDIS_CLUSTER_NODES: 'n:7000' }, `REDIS_URL and REDIS_CLUSTER_NODES are both set: ${ONE_REDIS}`],
  [{ REDIS_URL: 'redis://h:1', REDIS_SENTINELS: 's:1', REDIS_SENTINEL_NAME: 'm', REDIS_CLUSTER_NODES: 'n:7000' }, `REDIS_URL and REDIS_SENTINELS and REDIS_CLUSTER_NODES are all set: ${ONE_REDIS}`],
  [{ REDIS_SENTINELS: 's:26379' }, 'REDIS_SENTINELS needs REDIS_SENTINEL_NAME: set it to the master group the Sentinels monitor (the <name> of "sentinel monitor <name> ...")'],
  [{ REDIS_SENTINEL_NAME: 'm' }, "REDIS_SENTINEL_NAME is set without REDIS_SENTINELS: set REDIS_SENTINELS to the Sentinels' host:port list, or unset REDIS_SENTINEL_NAME"],
  [{ REDIS_CLUSTER_NODES: 'n:7000', REDIS_SENTINEL_NAME: 'm' }, "REDIS_SENTINEL_NAME is set without REDIS_SENTINELS: set REDIS_SENTINELS to the Sentinels' host:port list, or unset REDIS_SENTINEL_NAME"],
  [{ REDIS_CLUSTER_NODES: 'n:7000', REDIS_SENTINEL_PASSWORD: 'sentinel-secret' }, "REDIS_SENTINEL_PASSWORD is set without REDIS_SENTINELS: it is the Sentinels' password; set REDIS_SENTINELS, or unset it"],
  [{ REDIS_URL: 'redis://h:1', REDIS_PASSWORD: 'data-secret' }, 'REDIS_PASSWORD is set with REDIS_URL: put the credentials in the URL (redis://user:password@host:port), or unset REDIS_PASSWORD'],
  [{ REDIS_URL: 'redis://h:1', REDIS_USERNAME: 'gw' }, 'REDIS_USERNAME is set with REDIS_URL: put the credentials in the URL (redis://user:password@host:port), or unset REDIS_USERNAME'],
  [{ REDIS_PASSWORD: 'data-secret' }, `REDIS_PASSWORD is set but no Redis is: ${ONE_REDIS}, or unset REDIS_PASSWORD`],
  [{ REDIS_CLUSTER_NODES: 'n:7000', REDIS_USERNAME: 'gw' }, 'REDIS_USERNAME is set without REDIS_PASSWORD: an ACL user logs in with both; set REDIS_PASSWORD too'],
  [{ REDIS_TLS_CA: '/etc/ssl/ca.pem' }, `REDIS_TLS_CA is set but no Redis is: ${ONE_REDIS}, or unset REDIS_TLS_CA`],
  [{ REDIS_CLUSTER_NODES: 'n:7000,n:0' }, 'REDIS_CLUSTER_NODES="n:7000,n:0" is invalid: "n:0" is not host:port with a port from 1 to 65535; expected host:port,host:port'],
  [{ REDIS_CLUSTER_NODES: 'n:70000' }, 'REDIS_CLUSTER_NODES="n:70000" is invalid: "n:70000" is not host:port with a port from 1 to 65535; expected host:port,host:port'],
  [{ REDIS_CLUSTER_NODES: 'n1,n2' }, 'REDIS_CLUSTER_NODES="n1,n2" is invalid: does not have the expected form; expected some nodes of the Redis Cluster, comma-separated host:port'],
  [{ REDIS_SENTINELS: 's:26379 s2:26379', REDIS_SENTINEL_NAME: 'm' }, 'REDIS_SENTINELS="s:26379 s2:26379" is invalid: does not have the expected form; expected the Sentinels, comma-separated host:port (with REDIS_SENTINEL_NAME)'],
  [{ REDIS_URL: 'redis://:data-secret@h:0' }, 'REDIS_URL=(hidden) is invalid: port 0; use a port from 1 to 65535'],
  [{ REDIS_URL: 'redis://:data-secret@[::1' }, 'REDIS_URL=(hidden) is invalid: not a URL; expected redis://[user:password@]host:port[/db], or rediss:// for TLS']
]

for (const [env, message] of BAD_REDIS) {
  t.test(`Redis: bad combination ${Object.keys(env).join(' + ')}`, async (t) => {
    const err = t.throws(() => loadConfig(env), new ConfigError(message)) as Error
    t.notMatch(err.message, /\n/, 'one line')
    t.notMatch(err.message, /secret/, 'no password in it')
  })
}

// DECISIONS 35, "Workers": several processes share only what lives outside them.
const WORKERS = {
  GATEWAY_WORKERS: '2',
  PORT: '8080',
  JWT_SECRET: SECRET,
  UPSTREAM_URL: 'http://engine:4000',
  REDIS_URL: 'redis://redis:6379'
}
const WORKER_REFUSALS: Array<[Record<string, string>, string]> = [
  [{ ...WORKERS, REDIS_URL: '' },
    'GATEWAY_WORKERS=2 needs Redis: each worker would keep rate limits and idempotency records of its own; ' +
    'set REDIS_URL (or REDIS_SENTINELS with REDIS_SENTINEL_NAME, or REDIS_CLUSTER_NODES), or GATEWAY_WORKERS=1'],
  [{ ...WORKERS, UPSTREAM_URL: '' },
    'GATEWAY_WORKERS=2 needs UPSTREAM_URL: each worker would run an embedded engine with data of its own; ' +
    "set it to the engine's base URL, or GATEWAY_WORKERS=1"],
  [{ ...WORKERS, JWT_SECRET: '' },
    'GATEWAY_WORKERS=2 needs a JWT key: each worker would generate a secret of its own ' +
    "and refuse the others' tokens; " +
    'set JWT_SECRET, JWT_PUBLIC_KEY or JWT_JWKS_URL, or GATEWAY_WORKERS=1'],
  [{ ...WORKERS, PORT: '0' },
    'GATEWAY_WORKERS=2 with PORT=0: each worker would listen on a port of its own; set PORT to the port they share'],
  [{ ...WORKERS, METRICS_PORT: '65535' },
    'METRICS_PORT=65535 with GATEWAY_WORKERS=2: worker i serves metrics on METRICS_PORT + i, up to 65536; ' +
    'pick a METRICS_PORT of at most 65534, or 0 to turn metrics off'],
  [{ ...WORKERS, METRICS_PORT: '8079', GATEWAY_WORKERS: '3' },
    "PORT=8080 is one of the workers' metrics ports (METRICS_PORT + i, 8079-8081): " +
    'metrics never share the public port; pick a PORT outside that range or another METRICS_PORT'],
  [{ ...WORKERS, GATEWAY_WORKERS: '0' },
    'GATEWAY_WORKERS="0" is invalid: must be between 1 and 64; expected gateway processes sharing PORT ' +
    '(SO_REUSEPORT, Linux), each a full gateway; more than 1 needs Redis, UPSTREAM_URL, a JWT key and a fixed PORT, ' +
    'and worker i serves metrics on METRICS_PORT + i']
]

t.test('GATEWAY_WORKERS: 1 by default; more than 1 with Redis, an engine, a key and a fixed port', async (t) => {
  t.equal(loadConfig({}).workers, 1)
  t.equal(loadConfig(WORKERS).workers, 2)
  t.equal(loadConfig({ ...WORKERS, REDIS_URL: '', REDIS_CLUSTER_NODES: 'n1:7000,n2:7000' }).workers, 2,
    'any Redis mode is shared')
  t.equal(loadConfig({ ...WORKERS, GATEWAY_WORKERS: '1', REDIS_URL: '', PORT: '0' }).workers, 1,
    'one worker needs none of it')
  t.equal(loadConfig({ ...WORKERS, METRICS_PORT: '0', PORT: '9465' }).workers, 2,
    'no metrics: no metrics ports to keep clear')
})

for (const [env, message] of WORKER_REFUSALS) {
  t.test(`GATEWAY_WORKERS refused: ${message.slice(0, 60)}`, async (t) => {
    t.throws(() => loadConfig(env), new ConfigError(message))
    t.notMatch(message, /\n/, 'one line')
  })
}
