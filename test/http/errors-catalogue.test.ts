/** The catalogue in src/http/errors.ts and the table in docs/errors.md say the same thing. */
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import { CATALOGUE, GatewayError, wireBody } from '../../src/http/errors.js'
import { ROOT } from '../helpers/processes.js'

const page = readFileSync(join(ROOT, 'docs', 'errors.md'), 'utf8')
const start = page.indexOf('\n## The catalogue\n')
if (start < 0) throw new Error('docs/errors.md has no "## The catalogue" section')
const next = page.indexOf('\n## ', start + 1)
const section = page.slice(start, next < 0 ? undefined : next)
const rows = new Map(section.split('\n')
  .filter((line) => line.startsWith('| `'))
  .map((line) => line.split('|').map((cell) => cell.trim()))
  .map(([, code, status, shape, message]) => [code!.replace(/`/g, ''), { status, shape, message }]))

t.test('every catalogue entry has its row in docs/errors.md, and every row an entry', async (t) => {
  for (const [code, entry] of Object.entries(CATALOGUE)) {
    t.same(rows.get(code), { status: String(entry.status), shape: entry.shape, message: entry.message }, code)
  }
  t.same([...rows.keys()].sort(), Object.keys(CATALOGUE).sort())
})

t.test('wire shapes: structured needs a handler name, everything else is { error }', async (t) => {
  t.same(wireBody(new GatewayError('VALIDATION_ERROR', 'name is required'), 'createPortfolio'), {
    success: false, error: { source: 'portfolio-gateway', code: 'VALIDATION_ERROR', message: 'name is required', function: 'createPortfolio' }
  })
  t.same(wireBody(new GatewayError('INTERNAL_ERROR'), undefined), { error: 'internal error' })
  t.same(wireBody(new GatewayError('UPSTREAM_TIMEOUT'), 'updatePortfolio'), { error: 'portfolio engine timed out' })
})

t.test('an unexpected error becomes INTERNAL_ERROR with nothing of its own message', async (t) => {
  const { toGatewayError } = await import('../../src/http/error-handler.js')
  const bug = new TypeError("Cannot read properties of undefined (reading 'sub') at /srv/app/src/x.ts:12")
  const mapped = toGatewayError(bug)
  t.equal(mapped.code, 'INTERNAL_ERROR')
  t.equal(mapped.statusCode, 500)
  t.same(wireBody(mapped, 'updatePortfolio'), { success: false, error: { source: 'portfolio-gateway', code: 'INTERNAL_ERROR', message: 'internal error', function: 'updatePortfolio' } })
  t.equal(mapped.cause, bug, 'the original is kept for the log')
})
