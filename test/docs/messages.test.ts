/**
 * Every message the client docs quote in a body ("error": "...", "message":
 * "...") is one the gateway really sends: each is made here, over a real
 * socket, and a quote with no request that makes it fails.
 */
import { readFileSync } from 'node:fs'
import { connect } from 'node:net'
import { join } from 'node:path'
import t from 'tap'
import { request } from 'undici'
import { bearer, build, MINTS } from '../helpers/app.js'
import { startEngine } from '../helpers/engine.js'
import { multipartBody } from '../helpers/multipart.js'
import { ROOT } from '../helpers/processes.js'

const PAGES = ['README.md', 'docs/interface.md', 'docs/errors.md']

/** The quoted messages of the pages, "..." placeholders aside. */
function quoted (): Map<string, string[]> {
  const found = new Map<string, string[]>()
  for (const page of PAGES) {
    const text = readFileSync(join(ROOT, page), 'utf8')
    for (const match of text.matchAll(/"(?:error|message)": ?"([^"]+)"/g)) {
      if (match[1] === '...' || match[1] === '…') continue
      found.set(match[1]!, [...(found.get(match[1]!) ?? []), page])
    }
  }
  return found
}

async function messageOf (res: Awaited<ReturnType<typeof request>>): Promise<string> {
  const body = await res.body.json() as { error?: string | { message: string }, message?: string }
  return typeof body.error === 'object' ? body.error.message : body.error ?? body.message ?? ''
}

t.test('every message quoted in the docs is one the gateway sends', async (t) => {
  const engine = await startEngine(t)
  const { url } = await build(t, { upstreamUrl: engine.origin })
  const draining = await build(t, { lifecycle: { draining: true } })
  const json = { ...bearer(), 'content-type': 'application/json' }
  const form = (parts: Parameters<typeof multipartBody>[0]) => {
    const { body, contentType } = multipartBody(parts)
    return { method: 'POST' as const, headers: { ...bearer(), 'content-type': contentType }, body }
  }
  const fields = [{ name: 'name', value: 'x' }, { name: 'type', value: 'PORTFOLIO' }]
  const created = await request(`${url}/api/portfolio/create`, form(fields))
  const { portfolio_id: id } = await created.body.json() as { portfolio_id: string }
  const sent = new Set<string>([
    await messageOf(await request(`${url}/ping`)),
    await messageOf(await request(`${url}/api/portfolio/update`, { method: 'POST', headers: json })),
    await messageOf(await request(`${url}/api/portfolio/ping`)),
    await messageOf(await request(`${draining.url}/health`)),
    await messageOf(await request(`${url}/api/portfolio/update`, {
      method: 'POST',
      headers: json,
      body: JSON.stringify({ portfolio_id: id, target_positions: [{ mint: MINTS[0], allocation: 1 }] })
    })),
    await messageOf(await request(`${url}/api/portfolio/update`, {
      method: 'POST',
      headers: json,
      body: JSON.stringify({
        portfolio_id: 'p', target_positions: [{ mint: MINTS[0], allocation: 0 }, { mint: MINTS[1], allocation: 1.5 }]
      })
    })),
    await messageOf(await request(`${url}/api/portfolio/create`, form([{ name: 'name', value: 'x'.repeat(31) }])))
  ])
  // The parser's own answer, written on the socket.
  const socket = connect(Number(new URL(url).port), '127.0.0.1')
  socket.write(`GET /ping HTTP/1.1\r\nHost: x\r\nx-big: ${'a'.repeat(20_000)}\r\n\r\n`)
  let raw = ''
  for await (const chunk of socket) raw += String(chunk)
  sent.add((JSON.parse(raw.slice(raw.indexOf('\r\n\r\n') + 4)) as { error: string }).error)

  for (const [message, pages] of quoted()) t.ok(sent.has(message), `"${message}" (${pages.join(', ')}) is sent`)
})
