/**
 * freePort (deploy/local/parts.ts) never hands out one port twice in a
 * process: the kernel may give a port just closed again at once (on these
 * machines about one call in eight hundred did), and two parts started
 * together on one port fail one of their starts.
 */
import t from 'tap'
import { freePort } from '../../deploy/local/parts.js'

t.test('a thousand ports chosen in a row, and eight at once, are all different', async (t) => {
  const ports: number[] = []
  for (let i = 0; i < 1000; i++) ports.push(await freePort())
  ports.push(...await Promise.all(Array.from({ length: 8 }, async () => await freePort())))
  t.equal(new Set(ports).size, ports.length)
})
