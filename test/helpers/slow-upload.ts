/**
 * Creates sent the way a slow phone (or an attacker) sends them, with undici's
 * `request`: the form's first bytes (fields and the image's first 4 KiB),
 * then either nothing until `finish()`, a trickle, or a steady rate.
 */
import type { Readable } from 'node:stream'
import { request } from 'undici'
import { readFileSync } from 'node:fs'
import { PNG_IMAGE } from '../../fixtures/images.js'
import { hs256 } from './app.js'
import { multipartBody } from './multipart.js'

const PNG = readFileSync(PNG_IMAGE)

export function pngOf (size: number): Buffer {
  const data = Buffer.alloc(size, 0x42)
  PNG.copy(data, 0, 0, 8)
  return data
}

export interface Answer {
  status: number
  headers: Record<string, string | string[] | undefined>
  text: string
}

export interface SlowCreate {
  /** The gateway's answer (rejects if the exchange failed before one came). */
  answer: Promise<Answer>
  /** Send the rest of the form at once. */
  finish: () => void
  /** Give up: abort the client's request. */
  stop: () => void
}

export type Pace =
  /** Send nothing more until finish(). */
  | { kind: 'hold' } |
  /** `bytes` every `everyMs` until the form is sent or stop(). */
  { kind: 'trickle'; bytes: number; everyMs: number } |
  /** A steady `bytesPerS`, sent every `everyMs` on a schedule that does not drift. */
  { kind: 'steady'; bytesPerS: number; everyMs: number }

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

export function slowCreate (
  url: string,
  sub: string,
  pace: Pace,
  imageBytes = 1024 * 1024,
  headers: Record<string, string> = {}
): SlowCreate {
  const { body, contentType } = multipartBody([
    { name: 'name', value: 'Slow' },
    { name: 'type', value: 'PORTFOLIO' },
    { name: 'image', filename: 'a.png', contentType: 'image/png', data: pngOf(imageBytes) }
  ])
  const headEnd = Math.min(body.length, body.indexOf(PNG.subarray(0, 8)) + 4096)
  let release!: () => void
  const released = new Promise<void>((resolve) => {
    release = resolve
  })
  let stopped = false
  const abort = new AbortController()
  async function * form (): AsyncGenerator<Buffer> {
    let sent = headEnd
    yield body.subarray(0, sent)
    if (pace.kind === 'hold') {
      await released
    } else if (pace.kind === 'trickle') {
      let finishing = false
      void released.then(() => {
        finishing = true
      })
      while (!finishing && !stopped && sent < body.length) {
        await sleep(pace.everyMs)
        const next = Math.min(body.length, sent + pace.bytes)
        yield body.subarray(sent, next)
        sent = next
      }
    } else {
      const start = performance.now() - (sent / pace.bytesPerS) * 1000
      while (!stopped && sent < body.length) {
        await sleep(pace.everyMs)
        const due = Math.min(body.length, Math.floor(((performance.now() - start) / 1000) * pace.bytesPerS))
        if (due > sent) {
          yield body.subarray(sent, due)
          sent = due
        }
      }
    }
    if (!stopped && sent < body.length) yield body.subarray(sent)
  }
  const answer = (async (): Promise<Answer> => {
    const res = await request(`${url}/api/portfolio/create`, {
      method: 'POST',
      headers: { authorization: `Bearer ${hs256({ sub })}`, 'content-type': contentType, ...headers },
      // undici takes async iterables as bodies; its typings for request() list only streams.
      body: form() as unknown as Readable,
      signal: abort.signal
    })
    return { status: res.statusCode, headers: res.headers, text: await res.body.text() }
  })()
  answer.catch(() => {})
  return {
    answer,
    finish: release,
    stop: () => {
      stopped = true
      release()
      abort.abort()
    }
  }
}
