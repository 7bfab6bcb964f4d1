/**
 * DECISIONS 21: an early answer reaches the client.
 *
 * Real clients against a real gateway process (dist/, the decided bounds):
 * undici's fetch writes its whole body before it reads, so a gateway that
 * closes while it is still writing costs it the 401 (EPIPE: 9/20 at 1 KB,
 * 1/20 at 2 MB, 0/20 at 9 MB before this change); curl sends
 * `Expect: 100-continue` above 1 MiB and must get its 401 without sending the
 * body. The bounds of the lingering close: test/http/early-answers.test.ts.
 */
import { execFile } from 'node:child_process'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { promisify } from 'node:util'
import t from 'tap'
import { fetch, FormData } from 'undici'
import { hs256, SECRET } from '../helpers/app.js'
import { ensureBuilt, freePort, GATEWAY_SCRIPT, startProcess } from '../helpers/processes.js'

// 160 uploads and 80 curl processes: more than tap's 60 s on a loaded runner would be a fault of the runner, not of
// this.
t.setTimeout(180_000)

const run = promisify(execFile)
const SIZES = [['0 B', 0], ['1 KB', 1024], ['2 MB', 2_000_000], ['9 MB', 9_000_000]] as const
const TRIES = 20
const BAD_TOKEN_BODY = { error: 'invalid token' }

async function gateway (): Promise<string> {
  ensureBuilt()
  const port = await freePort()
  // Event-loop shedding off: on a loaded runner a stalled gateway would answer 503, and this is about the 401.
  const gw = await startProcess(t, GATEWAY_SCRIPT, { PORT: String(port), HOST: '127.0.0.1', JWT_SECRET: SECRET, METRICS_PORT: '0', LOG_LEVEL: 'info', SHED_EVENT_LOOP_DELAY_MS: '0' }, port, /gateway ready/)
  return gw.url
}

/** One PNG-looking image of `size` bytes (the 401 comes before anything looks at it). */
function image (size: number): Uint8Array<ArrayBuffer> {
  const bytes = new Uint8Array(size)
  bytes.set([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a].slice(0, size))
  return bytes
}

interface Outcome { ok: boolean, detail: string, uploaded?: number }

async function viaFetch (url: string, size: number): Promise<Outcome> {
  const form = new FormData()
  form.set('name', 'phone')
  form.set('image', new Blob([image(size)], { type: 'image/png' }), 'a.png')
  try {
    const res = await fetch(`${url}/api/portfolio/create`, { method: 'POST', headers: { authorization: 'Bearer expired.or.bad' }, body: form })
    const text = await res.text()
    return { ok: res.status === 401 && text === JSON.stringify(BAD_TOKEN_BODY), detail: `${res.status} ${text}` }
  } catch (err) {
    const cause = (err as { cause?: { code?: string } }).cause
    return { ok: false, detail: cause?.code ?? String(err) }
  }
}

async function viaCurl (url: string, file: string): Promise<Outcome> {
  try {
    const { stdout } = await run('curl', ['-sS', '-H', 'authorization: Bearer expired.or.bad', '-F', 'name=phone', '-F', `image=@${file};type=image/png`,
      '-w', '\n%{http_code} %{size_upload}', `${url}/api/portfolio/create`], { timeout: 30_000 })
    const [body, codes] = stdout.split('\n') as [string, string]
    const [status, uploaded] = codes.split(' ').map(Number) as [number, number]
    return { ok: status === 401 && body === JSON.stringify(BAD_TOKEN_BODY), detail: `${status} ${body}`, uploaded }
  } catch (err) {
    return { ok: false, detail: String((err as { stderr?: string }).stderr ?? err).trim() }
  }
}

t.test('undici fetch and curl read their 401, 20 times out of 20, at every size', async (t) => {
  const url = await gateway()
  const dir = await mkdtemp(join(tmpdir(), 'early-answers-'))
  t.teardown(async () => await rm(dir, { recursive: true, force: true }))
  const table: string[] = ['| client | ' + SIZES.map(([name]) => name).join(' | ') + ' |', '|---|' + SIZES.map(() => '---|').join('')]
  const rows: Record<string, string[]> = { 'undici fetch': [], curl: [] }
  for (const [name, size] of SIZES) {
    const file = join(dir, `${size}.png`)
    await writeFile(file, image(size))
    // Ten at a time: concurrent enough to be quick, not so many that a loaded runner times out.
    const outcomes: Record<string, Outcome[]> = { 'undici fetch': [], curl: [] }
    for (let batch = 0; batch < TRIES; batch += 10) {
      const [f, c] = await Promise.all([
        Promise.all(Array.from({ length: 10 }, async () => await viaFetch(url, size))),
        Promise.all(Array.from({ length: 10 }, async () => await viaCurl(url, file)))
      ])
      outcomes['undici fetch']!.push(...f)
      outcomes.curl!.push(...c)
    }
    for (const [client, list] of Object.entries(outcomes)) {
      const ok = list.filter((o) => o.ok).length
      rows[client]!.push(`${ok}/${TRIES}`)
      t.equal(ok, TRIES, `${client}, ${name}: ${[...new Set(list.filter((o) => !o.ok).map((o) => o.detail))].join('; ')}`)
    }
    if (size > 1024 * 1024) {
      // curl sends Expect: 100-continue above 1 MiB: the 401 comes instead of 100 Continue, and no body byte is sent.
      t.same([...new Set(outcomes.curl!.map((o) => o.uploaded))], [0], `curl, ${name}: the body was never sent`)
    }
  }
  for (const [client, cells] of Object.entries(rows)) table.push(`| ${client} | ${cells.join(' | ')} |`)
  t.comment(`bad-token creates that read their 401 (client x image size):\n${table.join('\n')}`)
})

t.test('a valid create from curl with Expect: 100-continue gets 100 Continue, then its 200', async (t) => {
  const url = await gateway()
  const dir = await mkdtemp(join(tmpdir(), 'early-answers-'))
  t.teardown(async () => await rm(dir, { recursive: true, force: true }))
  const file = join(dir, 'big.png')
  await writeFile(file, image(2_000_000))
  const { stdout, stderr } = await run('curl', ['-sS', '-v', '-H', `authorization: Bearer ${hs256()}`, '-F', 'name=Big', '-F', 'type=PORTFOLIO', '-F', `image=@${file};type=image/png`,
    '-w', '\n%{http_code} %{size_upload}', `${url}/api/portfolio/create`], { timeout: 30_000 })
  t.match(stderr, /> Expect: 100-continue/i, 'curl asked before sending the body')
  t.match(stderr, /< HTTP\/1\.1 100 Continue/, 'and was invited')
  const [body, codes] = stdout.split('\n') as [string, string]
  t.match(JSON.parse(body), { portfolio_id: /\S/ })
  const [status, uploaded] = codes.split(' ').map(Number)
  t.equal(status, 200)
  t.ok(uploaded! > 2_000_000, 'the whole body was sent')
})
