/**
 * freePort (deploy/local/parts.ts) never hands out one port twice in a
 * process: the kernel may give a port just closed again at once (on these
 * machines about one call in eight hundred did), and two parts started
 * together on one port fail one of their starts. It chooses below the kernel's
 * ephemeral range, where no other process's listen(0) or outgoing connection
 * can take a port between the choice and its use, and never one in use.
 */
import { once } from 'node:events'
import { createServer, type AddressInfo } from 'node:net'
import t from 'tap'
import { bindable, ephemeralRange, freePort, portPool, unusedPort } from '../../deploy/local/parts.js'
import { refusedPort } from '../../fixtures/stub-upstream.js'

t.test('a thousand ports chosen in a row, and eight at once, are all different', async (t) => {
  const ports: number[] = []
  for (let i = 0; i < 1000; i++) ports.push(await freePort())
  ports.push(...await Promise.all(Array.from({ length: 8 }, async () => await freePort())))
  t.equal(new Set(ports).size, ports.length)
})

t.test('freePort and refusedPort choose from 20000 up to the ephemeral range, never in it', async (t) => {
  const [low, high] = ephemeralRange()
  t.ok(low > 1024 && high >= low, `the ephemeral range read: ${low}-${high}`)
  const pool = portPool()
  // A machine whose ephemeral range starts below 21000 leaves no pool: the kernel chooses, as before.
  if (pool === undefined) return t.ok(low < 21_000, 'no pool only where the range leaves no room below it')
  t.same(pool, { low: 20_000, high: low - 1 })
  const ports = [
    ...await Promise.all(Array.from({ length: 50 }, async () => await freePort())),
    ...await Promise.all(Array.from({ length: 50 }, async () => await refusedPort()))
  ]
  t.same(ports.filter((port) => port < pool.low || port > pool.high), [], 'every port in the pool')
  t.equal(new Set(ports).size, ports.length, 'refusedPort never hands out a port freePort did, nor the reverse')
})

t.test('a port in use fails the trial listen, and a pool with no other port says so', async (t) => {
  const server = createServer().listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => server.close())
  const held = (server.address() as AddressInfo).port
  t.equal(await bindable(held), false, 'a trial listen on a port in use fails')
  await t.rejects(
    unusedPort(bindable, { low: held, high: held }),
    { message: `no usable loopback port in ${held}-${held} after 1000 tries` },
    'a pool of one port in use has none to give'
  )
})
