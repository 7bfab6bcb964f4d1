/**
 * The OTEL_* variables (DECISIONS 29), read and checked at start like every
 * other setting: unset endpoint means off; a bad value is a one-line error
 * that says how to fix it and never quotes the collector's headers.
 */
import t from 'tap'
import { ConfigError, loadConfig } from '../../src/config.js'

const BASE = { JWT_SECRET: 'x'.repeat(32) }
const load = (env: Record<string, string>) => loadConfig({ ...BASE, ...env })
const errorOf = (env: Record<string, string>): string => {
  try {
    load(env)
  } catch (err) {
    if (err instanceof ConfigError) return err.message
    throw err
  }
  return 'no error'
}

t.test('no endpoint: tracing is off', async (t) => {
  t.equal(load({}).tracing, undefined)
  t.equal(load({ OTEL_SERVICE_NAME: 'x', OTEL_TRACES_SAMPLER: 'always_on', OTEL_EXPORTER_OTLP_ENDPOINT: '' }).tracing, undefined, 'an empty endpoint counts as unset')
})

t.test('defaults: parentbased_traceidratio at 0.01, service portfolio-gateway, /v1/traces under the endpoint', async (t) => {
  t.same(load({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://jaeger:4318/' }).tracing, {
    url: 'http://jaeger:4318/v1/traces', headers: {}, serviceName: 'portfolio-gateway', resourceAttributes: {}, sampler: 'parentbased_traceidratio', ratio: 0.01
  })
})

t.test('every variable', async (t) => {
  t.same(load({
    OTEL_EXPORTER_OTLP_ENDPOINT: 'http://ignored:4318',
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'https://collector.example/otlp/traces',
    OTEL_EXPORTER_OTLP_HEADERS: 'authorization=Bearer%20s3cr3t, x-tenant = blue',
    OTEL_SERVICE_NAME: 'edge-eu',
    OTEL_RESOURCE_ATTRIBUTES: 'deployment.environment.name=prod,service.name=overridden,service.version=1.2%2C3',
    OTEL_TRACES_SAMPLER: 'traceidratio',
    OTEL_TRACES_SAMPLER_ARG: '0.25'
  }).tracing, {
    url: 'https://collector.example/otlp/traces',
    headers: { authorization: 'Bearer s3cr3t', 'x-tenant': 'blue' },
    serviceName: 'edge-eu',
    resourceAttributes: { 'deployment.environment.name': 'prod', 'service.name': 'overridden', 'service.version': '1.2,3' },
    sampler: 'traceidratio',
    ratio: 0.25
  })
  t.equal(load({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318', OTEL_RESOURCE_ATTRIBUTES: 'service.name=from-resource' }).tracing?.serviceName, 'from-resource', 'without OTEL_SERVICE_NAME, the resource\'s service.name')
})

t.test('bad values: one line naming the variable and the fix; the headers never quoted', async (t) => {
  const endpoint = { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318' }
  t.equal(errorOf({ OTEL_EXPORTER_OTLP_ENDPOINT: 'jaeger:4318' }), 'OTEL_EXPORTER_OTLP_ENDPOINT="jaeger:4318" is invalid: does not have the expected form; expected base URL of an OTLP/HTTP collector, e.g. http://jaeger:4318 (traces go to its /v1/traces); unset: no traces')
  t.equal(errorOf({ ...endpoint, OTEL_TRACES_SAMPLER: 'jaeger_remote' }), 'OTEL_TRACES_SAMPLER="jaeger_remote" is invalid: must be one of always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio; expected the sampler')
  t.equal(errorOf({ ...endpoint, OTEL_TRACES_SAMPLER_ARG: '1.5' }), 'OTEL_TRACES_SAMPLER_ARG="1.5" is invalid: does not have the expected form; expected the traceidratio samplers\' ratio, a number from 0 to 1, e.g. 0.01 (default)')
  t.equal(errorOf({ ...endpoint, OTEL_RESOURCE_ATTRIBUTES: 'a=1,oops' }), 'OTEL_RESOURCE_ATTRIBUTES is invalid: entry 2 is not key=value with a percent-encoded value; expected comma-separated key=value, e.g. deployment.environment.name=production')
  const badHeaders = errorOf({ ...endpoint, OTEL_EXPORTER_OTLP_HEADERS: 'authorization=Bearer%zzsecret-token' })
  t.equal(badHeaders, 'OTEL_EXPORTER_OTLP_HEADERS is invalid: entry 1 is not key=value with a percent-encoded value; expected comma-separated key=value, e.g. authorization=Bearer%20abc')
  t.equal(errorOf({ ...endpoint, OTEL_EXPORTER_OTLP_HEADERS: 'bad header=secret-token' }), 'OTEL_EXPORTER_OTLP_HEADERS is invalid: entry 1 does not name an HTTP header; expected comma-separated key=value, e.g. authorization=Bearer%20abc')
  for (const message of [badHeaders]) t.notMatch(message, /secret-token/)
  t.equal(errorOf({ ...endpoint, OTEL_SERVICE_NAME: ' leading-space' }), 'OTEL_SERVICE_NAME=" leading-space" is invalid: does not have the expected form; expected service.name of the spans, up to 255 characters; default portfolio-gateway (portfolio-engine for the engine)')
})

t.test('OTEL_EXPORTER_OTLP_TRACES_HEADERS adds to OTEL_EXPORTER_OTLP_HEADERS and wins per header', async (t) => {
  t.same(load({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://jaeger:4318', OTEL_EXPORTER_OTLP_HEADERS: 'authorization=Bearer%20general,x-tenant=blue', OTEL_EXPORTER_OTLP_TRACES_HEADERS: 'authorization=Bearer%20traces' }).tracing?.headers, {
    authorization: 'Bearer traces', 'x-tenant': 'blue'
  })
  const message = errorOf({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://jaeger:4318', OTEL_EXPORTER_OTLP_TRACES_HEADERS: 'authorization=Bearer%20s3cr3t,%zz' })
  t.equal(message, 'OTEL_EXPORTER_OTLP_TRACES_HEADERS is invalid: entry 2 is not key=value with a percent-encoded value; expected comma-separated key=value, e.g. authorization=Bearer%20abc')
  t.notMatch(message, /s3cr3t/)
})

t.test('an OTLP variable the exporter would read on its own is refused by name, never quoted', async (t) => {
  const supported = 'only OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_TRACES_HEADERS are read'
  for (const name of ['OTEL_EXPORTER_OTLP_COMPRESSION', 'OTEL_EXPORTER_OTLP_TRACES_COMPRESSION', 'OTEL_EXPORTER_OTLP_TIMEOUT', 'OTEL_EXPORTER_OTLP_TRACES_PROTOCOL', 'OTEL_EXPORTER_OTLP_CERTIFICATE', 'OTEL_EXPORTER_OTLP_CLIENT_KEY', 'OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE']) {
    const message = errorOf({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://jaeger:4318', [name]: 'secret-value-x' })
    t.ok(message.startsWith(`${name} is not supported: unset it; `), message)
    t.ok(message.includes(supported), message)
    t.notMatch(message, /secret-value-x/)
    t.notMatch(message, /\n/)
  }
  // Another signal's variables are not the trace exporter's; empty counts as unset; tracing off reads nothing.
  t.equal(load({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://jaeger:4318', OTEL_EXPORTER_OTLP_METRICS_PROTOCOL: 'grpc', OTEL_EXPORTER_OTLP_COMPRESSION: '' }).tracing?.url, 'http://jaeger:4318/v1/traces')
  t.equal(load({ OTEL_EXPORTER_OTLP_COMPRESSION: 'gzip' }).tracing, undefined)
})
