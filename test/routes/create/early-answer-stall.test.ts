/**
 * An engine that answers a keyed create before the whole form is in: the
 * gateway still reads the rest of the form (the Idempotency-Key fingerprint
 * covers it all, DECISIONS 16) and holds the client to the minimum rate
 * (DECISIONS 23) while it does. A client that stalls there gets its 408 and
 * the connection closes, instead of no answer until the socket's idle timeout.
 */
import { request as httpRequest, type IncomingMessage } from 'node:http'
import { once } from 'node:events'
import t, { type Test } from 'tap'
import { startStubUpstream } from '../../../fixtures/stub-upstream.js'
import { build, hs256 } from '../../helpers/app.js'
import { multipartBody } from '../../helpers/multipart.js'
import { pngOf, slowCreate } from '../../helpers/slow-upload.js'

const RULE = { stallMs: 500, windowMs: 60_000, bytesPerS: 1, tickMs: 100 }
const STALLED = { error: 'upload stalled: no byte for 0.5 s' }

/** The answer, or 'none' if none came within 10 s (a stall limit of 0.5 s). */
async function within10s<T> (answer: Promise<T>): Promise<T | 'none'> {
  let timer: NodeJS.Timeout | undefined
  const bound = new Promise<'none'>((resolve) => {
    timer = setTimeout(() => resolve('none'), 10_000)
  })
  try {
    return await Promise.race([answer, bound])
  } finally {
    clearTimeout(timer)
  }
}

t.test(
  'the engine answered a keyed create before its image, then the client stalled: 408 within the stall limit',
  async (t) => {
    const stub = await startStubUpstream()
    t.teardown(stub.close)
    // The engine answers as the request arrives, before reading the image.
    stub.early = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ portfolio_id: 'p-early' }))
    }
    const { url } = await build(t, { upstreamUrl: stub.url, uploadMinRate: RULE })
    const slow = slowCreate(url, 'stalls-after-answer', { kind: 'hold' }, 1024 * 1024, {
      'idempotency-key': 'early-then-stall-1'
    })
    t.teardown(() => {
      slow.finish()
    })
    const started = performance.now()
    const answer = await within10s(slow.answer)
    if (answer === 'none') return t.fail('no answer within 10 s of a stall limit of 0.5 s')
    t.equal(answer.status, 408)
    t.same(JSON.parse(answer.text), STALLED)
    t.equal(answer.headers.connection, 'close')
    const took = performance.now() - started
    t.ok(took < 5_000, `answered after ${took.toFixed(0)} ms (stall limit 500 ms)`)
  }
)

/** A client that writes `sent` bytes of `body` at once, then nothing: its response, when one comes. */
function sendThenHold (
  t: Test,
  url: string,
  body: Buffer,
  contentType: string,
  sent: number,
  headers: Record<string, string>
): Promise<{ res: IncomingMessage; text: string }> {
  const req = httpRequest(`${url}/api/portfolio/create`, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${hs256({ sub: 'fast-then-stall' })}`,
      'content-type': contentType,
      'content-length': body.length,
      ...headers
    }
  })
  req.on('error', () => {})
  t.teardown(() => {
    req.destroy()
  })
  req.write(body.subarray(0, sent))
  return (async () => {
    const [res] = (await once(req, 'response')) as [IncomingMessage]
    let text = ''
    for await (const chunk of res) text += String(chunk)
    return { res, text }
  })()
}

t.test(
  'the engine answered mid-image while the client was still sending fast, then the client stalled: 408 within the stall limit',
  async (t) => {
    const stub = await startStubUpstream()
    t.teardown(stub.close)
    // The engine reads 200 kB, answers, and reads on: the gateway has chunks in flight to it when the answer comes.
    stub.early = (req, res) => {
      let read = 0
      req.on('data', (chunk: Buffer) => {
        read += chunk.length
        if (read >= 200_000 && !res.headersSent) {
          res.writeHead(200, { 'content-type': 'application/json' })
          res.end(JSON.stringify({ portfolio_id: 'p-mid' }))
        }
      })
    }
    const { url } = await build(t, { upstreamUrl: stub.url, uploadMinRate: RULE })
    const { body, contentType } = multipartBody([
      { name: 'name', value: 'Fast then stalled' },
      { name: 'type', value: 'PORTFOLIO' },
      { name: 'image', filename: 'a.png', contentType: 'image/png', data: pngOf(3 * 1024 * 1024) }
    ])
    const started = performance.now()
    const answer = await within10s(
      sendThenHold(t, url, body, contentType, 1024 * 1024, { 'idempotency-key': 'mid-then-stall-1' })
    )
    if (answer === 'none') return t.fail('no answer within 10 s of a stall limit of 0.5 s')
    t.equal(answer.res.statusCode, 408)
    t.same(JSON.parse(answer.text), STALLED)
    t.equal(answer.res.headers.connection, 'close')
    const took = performance.now() - started
    t.ok(took < 5_000, `answered after ${took.toFixed(0)} ms (stall limit 500 ms)`)
  }
)
