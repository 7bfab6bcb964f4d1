/** The gateway's environment (docs/decisions/configuration.md): type, validation and messages from one schema. */
import { Type, type Static } from '@sinclair/typebox'

/** Only plain digits: '40.5' and '4e3' are errors, not 40 and 4. */
const Integer = (min: number, max: number, description: string, dflt: number) =>
  Type.Integer({ minimum: min, maximum: max, default: dflt, description })

/** OpenTelemetry's standard variables (decision: traces); with no endpoint, no tracing at all. */
export const OtelEnv = Type.Object({
  OTEL_EXPORTER_OTLP_ENDPOINT: Type.Optional(Type.String({
    pattern: '^https?://[^\\s]+$',
    description: 'base URL of an OTLP/HTTP collector, e.g. http://jaeger:4318 (traces go to its /v1/traces); unset: ' +
      'no traces'
  })),
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: Type.Optional(Type.String({
    pattern: '^https?://[^\\s]+$',
    description: 'full URL of an OTLP/HTTP traces endpoint, e.g. http://jaeger:4318/v1/traces (wins over ' +
      'OTEL_EXPORTER_OTLP_ENDPOINT)'
  })),
  OTEL_EXPORTER_OTLP_HEADERS: Type.Optional(Type.String({
    minLength: 1,
    description: 'headers for the collector, comma-separated key=value (values percent-encoded), e.g. ' +
      'authorization=Bearer%20abc'
  })),
  OTEL_EXPORTER_OTLP_TRACES_HEADERS: Type.Optional(Type.String({
    minLength: 1,
    description: 'headers for the traces endpoint, like OTEL_EXPORTER_OTLP_HEADERS; a header named in both takes ' +
      'this value'
  })),
  OTEL_SERVICE_NAME: Type.Optional(Type.String({
    pattern: '^\\S.{0,254}$',
    description: 'service.name of the spans, up to 255 characters; default portfolio-gateway (portfolio-engine for ' +
      'the engine)'
  })),
  OTEL_RESOURCE_ATTRIBUTES: Type.Optional(Type.String({
    minLength: 1,
    description: 'resource attributes, comma-separated key=value (values percent-encoded), e.g. ' +
      'deployment.environment.name=prod'
  })),
  OTEL_TRACES_SAMPLER: Type.Union(
    ['always_on', 'always_off', 'traceidratio', 'parentbased_always_on', 'parentbased_always_off',
      'parentbased_traceidratio'].map((s) => Type.Literal(s)),
    { default: 'parentbased_traceidratio', description: 'the sampler' }
  ),
  OTEL_TRACES_SAMPLER_ARG: Type.Optional(Type.String({
    pattern: '^(0(\\.\\d+)?|1(\\.0*)?|\\.\\d+)$',
    description: 'the traceidratio samplers\' ratio, a number from 0 to 1, e.g. 0.01 (default)'
  }))
})
export type OtelEnv = Static<typeof OtelEnv>

export const Env = Type.Object({
  ...OtelEnv.properties,
  NODE_ENV: Type.Union([Type.Literal('development'), Type.Literal('production'), Type.Literal('test')], {
    default: 'development',
    description: 'development, production or test; production refuses to start without a JWT key or UPSTREAM_URL'
  }),
  PORT: Integer(0, 65535, 'listen port', 3000),
  HOST: Type.String({ minLength: 1, default: '0.0.0.0', description: 'listen address' }),
  LOG_LEVEL: Type.Union(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'].map((l) => Type.Literal(l)), {
    default: 'info',
    description: 'pino level'
  }),
  JWT_SECRET: Type.Optional(Type.String({
    minLength: 32,
    description: 'HS256 secret, e.g. the output of openssl rand -hex 32'
  })),
  JWT_PUBLIC_KEY: Type.Optional(Type.String({ minLength: 1, description: 'PEM public key for RS256 or ES256' })),
  JWT_ISSUER: Type.Optional(Type.String({ minLength: 1, description: 'required iss claim' })),
  JWT_AUDIENCE: Type.Optional(Type.String({ minLength: 1, description: 'required aud claim' })),
  JWT_JWKS_URL: Type.Optional(Type.String({
    pattern: '^https?://[^\\s]+$',
    description: "the identity provider's JSON Web Key Set, an http(s) URL"
  })),
  JWT_CLOCK_TOLERANCE_S: Integer(0, 300, 'seconds of clock drift allowed when checking exp and nbf', 5),
  JWT_JWKS_COOLDOWN_S: Integer(1, 3600, 'seconds between key-set refetches caused by an unknown kid', 30),
  UPSTREAM_URL: Type.Optional(Type.String({
    pattern: '^https?://[^\\s/?#,]+/?(\\s*,\\s*https?://[^\\s/?#,]+/?)*$',
    description: 'base URL of the engine, http(s)://host:port with no path; several, comma-separated, for several ' +
      'engine instances'
  })),
  UPSTREAM_TIMEOUT_MS: Integer(1, 600_000, 'how long to wait for the engine response headers, in ms', 10_000),
  METRICS_PORT: Integer(0, 65535, 'port of the Prometheus /metrics listener on HOST, 0 for none', 9464),
  RATE_LIMIT_PER_MINUTE: Integer(0, 1_000_000,
    'requests per user (token sub) per 60 s on /api/*, 0 turns the limit off', 600),
  REDIS_URL: Type.Optional(Type.String({
    pattern: '^rediss?://[^\\s]+$',
    description: 'redis://[user:password@]host:port[/db] for shared rate limits and idempotency records'
  })),
  REDIS_SENTINELS: Type.Optional(Type.String({
    pattern: '^[^\\s,]+:\\d{1,5}(,[^\\s,]+:\\d{1,5})*$',
    description: 'the Sentinels, comma-separated host:port (with REDIS_SENTINEL_NAME)'
  })),
  REDIS_SENTINEL_NAME: Type.Optional(Type.String({
    pattern: '^[^\\s]+$',
    description: 'the master group the Sentinels watch (sentinel monitor <name> ...)'
  })),
  REDIS_CLUSTER_NODES: Type.Optional(Type.String({
    pattern: '^[^\\s,]+:\\d{1,5}(,[^\\s,]+:\\d{1,5})*$',
    description: 'some nodes of the Redis Cluster, comma-separated host:port'
  })),
  REDIS_USERNAME: Type.Optional(Type.String({
    minLength: 1,
    description: 'ACL user of the data nodes, with REDIS_SENTINELS or REDIS_CLUSTER_NODES'
  })),
  REDIS_PASSWORD: Type.Optional(Type.String({
    minLength: 1,
    description: 'password of the data nodes, with REDIS_SENTINELS or REDIS_CLUSTER_NODES'
  })),
  REDIS_SENTINEL_PASSWORD: Type.Optional(Type.String({
    minLength: 1,
    description: 'password of the Sentinels, when they ask for one'
  })),
  REDIS_TLS_CA: Type.Optional(Type.String({
    minLength: 1,
    description: "path of a PEM file with the CA that signed Redis's certificate; turns TLS on for REDIS_SENTINELS " +
      'and REDIS_CLUSTER_NODES'
  })),
  IDEMPOTENCY_TTL_S: Integer(1, 30 * 86_400, 'how long an Idempotency-Key record is kept, in seconds', 86_400),
  SHED_EVENT_LOOP_DELAY_MS: Integer(0, 60_000,
    'event loop delay past which new /api/* requests get 503, in ms; 0 turns it off', 200),
  UPSTREAM_MAX_QUEUE: Integer(1, 100_000,
    'requests that may wait for an engine connection; past it new /api/* requests get 503', 256),
  TRUST_PROXY: Type.Optional(Type.String({
    minLength: 1,
    description: 'comma-separated IP addresses or CIDRs of the load balancers whose X-Forwarded-For is believed, ' +
      'e.g. 10.0.0.0/8,fd00::/8; unset: none'
  })),
  UPLOAD_MAX_PER_USER: Integer(1, 1000,
    'creates one user (token sub) may have in progress at once; one more gets 429', 2),
  UPLOAD_MAX_CONNECTIONS: Integer(1, 127,
    'engine connections per engine endpoint that streaming creates may hold together (of 128); past it a create ' +
    'waits, then 503', 32),
  LINGER_BODY_FACTOR: Integer(1, 16,
    "a refused body declared at most this many times the route's body limit (create: 10 MiB) is read and thrown " +
    "away while the client keeps up the uploads' minimum rate; a larger one is closed after the answer", 2),
  LINGER_MAX_SOCKETS: Integer(1, 1_000_000,
    'connections that may read the rest of a refused body at once; one more cuts, of the addresses that hold the ' +
    'most, the linger with the most time left to its end', 1024),
  LINGER_MAX_PER_ADDRESS: Integer(1, 1_000_000,
    'connections from one client address (the one a TRUST_PROXY peer forwards) that may read the rest of a refused ' +
    'body at once (IPv6 counted per /64); one more cuts the one of that address with the most time left; ' +
    'at most LINGER_MAX_SOCKETS', 16),
  UPSTREAM_TRY_TIMEOUT_MS: Type.Optional(Type.Integer({
    minimum: 1,
    maximum: 600_000,
    description: 'how long one try of a GET to the engine may wait for headers before it is retried on another ' +
      'endpoint, in ms; default a third of UPSTREAM_TIMEOUT_MS'
  })),
  UPSTREAM_DNS_SERVERS: Type.Optional(Type.String({
    minLength: 1,
    description: 'DNS servers for the host names in UPSTREAM_URL, comma-separated ip or ip:port ([ipv6]:port), e.g. ' +
      "10.96.0.10 or 127.0.0.1:5353 (Envoy's dns_resolvers); asked directly with c-ares: a lookup holds no libuv " +
      "pool thread (getaddrinfo does), and no libc cache such as nscd answers in their place; /etc/resolv.conf's " +
      'search and ndots still apply; start-up waits for the first answer, at most 5 s; unset: the system resolver'
  })),
  UPSTREAM_DNS_REFRESH_MS: Integer(100, 3_600_000,
    "how often the host names in UPSTREAM_URL are resolved again, in ms (Envoy's default, 5000); a name is also " +
    'resolved at once when an endpoint becomes unreachable', 5_000),
  GATEWAY_WORKERS: Integer(1, 64,
    'gateway processes sharing PORT (SO_REUSEPORT, Linux), each a full gateway; more than 1 needs Redis, ' +
    'UPSTREAM_URL, a JWT key and a fixed PORT, and worker i serves metrics on METRICS_PORT + i', 1)
})
export type Env = Static<typeof Env>
