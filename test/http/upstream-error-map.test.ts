/**
 * The one map from engine-call failures to what the client gets: only what the engine did is a 502/504; undici's
 * gateway-side codes
 * are the gateway's own 500. Real undici error classes, matched on `code`.
 */
import t from 'tap'
import { errors } from 'undici'
import { upstreamError } from '../../src/http/errors.js'

const sys = (code: string): NodeJS.ErrnoException => Object.assign(new Error(code), { code })

t.test('each failure maps to the status its cause deserves', async (t) => {
  const cases: Array<[string, unknown, string, number]> = [
    ['refused', sys('ECONNREFUSED'), 'UPSTREAM_UNAVAILABLE', 502],
    ['reset', sys('ECONNRESET'), 'UPSTREAM_UNAVAILABLE', 502],
    ['another socket error', sys('EPROTO'), 'UPSTREAM_UNAVAILABLE', 502],
    ['socket closed', new errors.SocketError('other side closed'), 'UPSTREAM_UNAVAILABLE', 502],
    ['connect timeout', new errors.ConnectTimeoutError(), 'UPSTREAM_UNAVAILABLE', 502],
    ['headers timeout', new errors.HeadersTimeoutError(), 'UPSTREAM_TIMEOUT', 504],
    ['body timeout', new errors.BodyTimeoutError(), 'UPSTREAM_TIMEOUT', 504],
    ['not HTTP', Object.assign(new errors.HTTPParserError('bad'), { code: 'HPE_INVALID_CONSTANT' }), 'UPSTREAM_BAD_RESPONSE', 502],
    ['headers overflow', new errors.HeadersOverflowError(), 'UPSTREAM_BAD_RESPONSE', 502],
    ['response length mismatch', new errors.ResponseContentLengthMismatchError(), 'UPSTREAM_BAD_RESPONSE', 502],
    ['response too large', new errors.ResponseExceededMaxSizeError(), 'UPSTREAM_BAD_RESPONSE', 502],
    ['invalid argument (the gateway built a bad request)', new errors.InvalidArgumentError('bad'), 'INTERNAL_ERROR', 500],
    ['not supported', new errors.NotSupportedError('no'), 'INTERNAL_ERROR', 500],
    ['request length mismatch (the gateway sent a wrong length)', new errors.RequestContentLengthMismatchError(), 'INTERNAL_ERROR', 500],
    ['aborted by the gateway', new errors.RequestAbortedError(), 'INTERNAL_ERROR', 500],
    ['a bug of ours', new TypeError('x is undefined'), 'INTERNAL_ERROR', 500]
  ]
  for (const [what, err, code, status] of cases) {
    const mapped = upstreamError(err)
    t.same([mapped.code, mapped.statusCode], [code, status], what)
    t.equal(mapped.cause, err, `${what}: the original is kept as cause`)
  }
})
