/**
 * The waits of an upload on its form parser (src/routes/create/interruptible.ts):
 * failed at once by an interrupt, and holding nothing once settled. The second
 * is what Promise.race against one long-lived promise got wrong: every chunk
 * of an image stayed reachable until its upload ended.
 */
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import t, { type Test } from 'tap'
import { Interruptible } from '../../../src/routes/create/interruptible.js'

setFlagsFromString('--expose-gc')
const gc = runInNewContext('gc') as () => void

/** Pass 20 chunks of 64 KiB through one reader's waits, as an image's chunks pass; weak references to them. */
async function passChunks (t: Test, reads: Interruptible): Promise<Array<WeakRef<Buffer>>> {
  const chunks: Array<WeakRef<Buffer>> = []
  for (let i = 0; i < 20; i++) {
    const chunk = Buffer.alloc(64 * 1024, i)
    chunks.push(new WeakRef(chunk))
    t.equal((await reads.wait(Promise.resolve(chunk)))[0], i)
  }
  return chunks
}

t.test('a settled wait keeps nothing of its value', async (t) => {
  const reads = new Interruptible()
  const chunks = await passChunks(t, reads)
  // Let the promise jobs finish, then collect.
  await new Promise((resolve) => setImmediate(resolve))
  gc()
  t.same(chunks.flatMap((ref, i) => ref.deref() === undefined ? [] : [i]), [], 'every chunk collectable while the reader lives on')
  t.ok(reads, 'the reader is still alive')
})

t.test('an interrupt fails the waits in progress and every later one, with the first reason', async (t) => {
  const reads = new Interruptible()
  const never = new Promise<never>(() => {})
  const a = reads.wait(never)
  const b = reads.wait(never)
  reads.interrupt(new Error('body must be at most 10 bytes'))
  reads.interrupt(new Error('second reason'))
  await t.rejects(a, { message: 'body must be at most 10 bytes' })
  await t.rejects(b, { message: 'body must be at most 10 bytes' })
  let settled = false
  const late = Promise.reject(new Error('the parser failed too'))
  await t.rejects(reads.wait(late).finally(() => { settled = true }), { message: 'body must be at most 10 bytes' }, 'a later wait fails at once')
  t.ok(settled)
})

t.test('without an interrupt a wait gives its own outcome', async (t) => {
  const reads = new Interruptible()
  t.equal(await reads.wait(Promise.resolve('field')), 'field')
  await t.rejects(reads.wait(Promise.reject(new Error('Unexpected end of form'))), { message: 'Unexpected end of form' })
})
