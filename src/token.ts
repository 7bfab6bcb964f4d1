/**
 * `npm run token -- --sub alice [--expires-in 1h] [--private-key key.pem]`
 * prints a token the gateway accepts with the same environment.
 */
import { readFileSync } from 'node:fs'
import { parseArgs } from 'node:util'
import fastifyJwt from '@fastify/jwt'
import Fastify from 'fastify'
import { ConfigError, loadConfig } from './config.js'

const { values } = parseArgs({
  options: {
    sub: { type: 'string', default: 'dev-user' },
    'expires-in': { type: 'string', default: '1h' },
    'private-key': { type: 'string' }
  }
})

function fail (message: string): never {
  process.stderr.write(`token: ${message}\n`)
  process.exit(1)
}

let config
try {
  config = loadConfig(process.env)
} catch (err) {
  fail(err instanceof ConfigError ? err.message : String(err))
}
const { jwt } = config
if (jwt.generated) {
  fail('no JWT_SECRET or JWT_PUBLIC_KEY is set: set the same one the gateway runs with, e.g. export JWT_SECRET=$(openssl rand -hex 32)')
}
if (jwt.algorithm !== 'HS256' && values['private-key'] === undefined) {
  fail(`JWT_PUBLIC_KEY is set (${jwt.algorithm}): pass the matching private key with --private-key <file.pem>`)
}

const app = Fastify()
await app.register(fastifyJwt, {
  secret: jwt.algorithm === 'HS256' ? jwt.key : { private: readFileSync(values['private-key']!, 'utf8'), public: jwt.key },
  sign: {
    algorithm: jwt.algorithm,
    ...(jwt.issuer === undefined ? {} : { iss: jwt.issuer }),
    ...(jwt.audience === undefined ? {} : { aud: jwt.audience })
  }
})
process.stdout.write(app.jwt.sign({ sub: values.sub }, { expiresIn: values['expires-in'] }) + '\n')
