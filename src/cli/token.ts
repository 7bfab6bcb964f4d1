/**
 * `npm run token -- --sub alice [--expires-in 1h] [--private-key key.pem]`
 * prints a token the gateway accepts with the same environment.
 */
import '../shared/runtime-guard.js'
import { readFileSync } from 'node:fs'
import { parseArgs } from 'node:util'
import fastifyJwt from '@fastify/jwt'
import Fastify from 'fastify'
import { ConfigError, loadConfig } from '../config.js'
import { SANE_SUBJECT, SUBJECT_RULE } from '../shared/subject.js'

function fail (message: string): never {
  process.stderr.write(`token: ${message}\n`)
  process.exit(1)
}

/** Any error ends the process with one line, never a stack trace. */
function attempt<T> (fn: () => T, what: string): T {
  try {
    return fn()
  } catch (err) {
    return fail(`${what}: ${err instanceof Error ? err.message : String(err)}`)
  }
}

const { values } = attempt(() => parseArgs({
  options: {
    sub: { type: 'string', default: 'dev-user' },
    'expires-in': { type: 'string', default: '1h' },
    'private-key': { type: 'string' }
  }
}), 'usage: npm run token -- --sub <user> [--expires-in 1h] [--private-key key.pem]')

if (!SANE_SUBJECT.test(values.sub)) fail(`--sub must be ${SUBJECT_RULE}, the rule the gateway applies to sub`)

let config
try {
  config = loadConfig(process.env)
} catch (err) {
  fail(err instanceof ConfigError ? err.message : String(err))
}
const { jwt } = config
if (jwt.source === 'jwks') {
  fail('JWT_JWKS_URL is set: tokens come from your identity provider, ' +
    'not from this tool (unset JWT_JWKS_URL to mint test tokens)')
}
if (jwt.generated) {
  fail('no JWT_SECRET or JWT_PUBLIC_KEY is set: ' +
    'set the same one the gateway runs with, e.g. export JWT_SECRET=$(openssl rand -hex 32)')
}
if (jwt.algorithm !== 'HS256' && values['private-key'] === undefined) {
  fail(`JWT_PUBLIC_KEY is set (${jwt.algorithm}): pass the matching private key with --private-key <file.pem>`)
}

const privateKey = jwt.algorithm === 'HS256'
  ? undefined
  : attempt(() => readFileSync(values['private-key']!, 'utf8'), 'cannot read --private-key')
const app = Fastify()
await app.register(fastifyJwt, {
  secret: privateKey === undefined ? jwt.key : { private: privateKey, public: jwt.key },
  sign: {
    algorithm: jwt.algorithm,
    ...(jwt.issuer === undefined ? {} : { iss: jwt.issuer }),
    ...(jwt.audience === undefined ? {} : { aud: jwt.audience })
  }
})
const token = attempt(
  () => app.jwt.sign({ sub: values.sub }, { expiresIn: values['expires-in'] }),
  'cannot sign (is --expires-in like 30m, 1h, 7d?)'
)
process.stdout.write(token + '\n')
