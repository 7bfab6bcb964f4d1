/**
 * A Redis Cluster being grown (DECISIONS 26): a fourth primary joins with no
 * slot (CLUSTER MEET) and slots are moved onto it. The gateway's client has
 * never heard of that node: CLUSTER SLOTS lists only nodes that hold slots,
 * so it learns of it from the first ASK or MOVED that names it. Those first
 * redirections must neither end the process nor reorder the commands.
 */
import { once } from 'node:events'
import type { Cluster } from 'ioredis'
import t, { type Test } from 'tap'
import { RedisStore } from '../../../src/limits/redis-store.js'
import { untilStoreAnswers } from '../../helpers/redis.js'
import { within } from '../../helpers/redis-gateways.js'
import { type ClusterNode, type ClusterSetup, requireTools, startCluster } from '../../helpers/redis-topology.js'
import { silent } from '../../helpers/silent-log.js'

t.setTimeout(120_000)

/** A store on the three original nodes, its counters' client ready; `commandTimeoutMs` as the store's option. */
async function storeOn (t: Test, cluster: ClusterSetup, commandTimeoutMs?: number): Promise<Cluster> {
  const nodes = cluster.nodes.map((n) => ({ host: '127.0.0.1', port: n.port }))
  const store = new RedisStore({
    redis: { mode: 'cluster', nodes },
    log: silent,
    ...(commandTimeoutMs === undefined ? {} : { commandTimeoutMs })
  })
  t.teardown(() => store.close())
  await untilStoreAnswers(store)
  if (store.client.status !== 'ready') await within(once(store.client, 'ready'), 10_000, "the counters' client")
  return store.client as Cluster
}

/** The ports of the nodes in the client's pool. */
const pool = (client: Cluster): number[] => client.nodes('all').map((n) => Number(n.options.port)).sort()

/** A key of this test whose slot is on one of the original nodes, and that node. */
async function keyFor (cluster: ClusterSetup, name: string): Promise<{ key: string, slot: number, from: ClusterNode }> {
  const key = `pgw:up:{${name}-${Date.now()}}`
  const slot = await cluster.slotOf(key)
  return { key, slot, from: await cluster.ownerOf(slot) }
}

if (requireTools(t, ['redis-server', 'redis-cli'], 'Redis Cluster')) {
  t.test('a cluster grown by a primary that holds no slot yet', async (t) => {
    const cluster = await startCluster(t, { empty: true })
    const empty = cluster.empty!

    t.test('a command redirected by MOVED to a node the client does not hold yet goes out before the commands sent after it', async (t) => {
      // The order is what is tested, not the 300 ms command timeout: a loaded machine may take longer to connect.
      const client = await storeOn(t, cluster, 10_000)
      const { key, slot, from } = await keyFor(cluster, 'moved')
      await client.zadd(key, Date.now() + 60_000, 'ended')
      // The slot moves onto the empty node entirely: the client's slot map still names the old node, which answers
      // MOVED.
      await cluster.moveSlot(slot, empty)
      // Given back to its first node at the end, so the empty node holds no slot for the next test's client.
      t.teardown(async () => { await cluster.moveSlot(slot, from) })
      t.notOk(pool(client).includes(empty.port), 'the client has not heard of the new node yet')
      // A command refused by a connection being made is retried retryDelayOnFailover later: 2 s here, so a retry
      // shows as a time no loaded machine reaches otherwise.
      client.options.retryDelayOnFailover = 2_000
      const started = performance.now()
      const zrem = client.zrem(key, 'ended').then((removed) => ({ removed, ms: performance.now() - started }))
      const zcard = client.zcard(key)
      const { removed, ms } = await zrem
      t.equal(removed, 1, 'the ZREM removed the lease on the new node')
      t.ok(ms < 1_000, `the ZREM was answered at once, not retried 2 s later (${Math.round(ms)} ms)`)
      t.equal(await zcard, 0, 'the ZCARD sent after it sees its effect')
      t.equal(await empty.client.exists(key), 0)
    })

    t.test('the ASKING sent unwatched before a command redirected to the new node never ends the process', async (t) => {
      const unhandled: string[] = []
      const onUnhandled = (err: unknown): void => { unhandled.push(String((err as Error)?.message ?? err)) }
      process.on('unhandledRejection', onUnhandled)
      t.teardown(() => { process.off('unhandledRejection', onUnhandled) })
      const client = await storeOn(t, cluster)
      t.notOk(pool(client).includes(empty.port), 'the client has not heard of the new node yet')
      const { key, slot, from } = await keyFor(cluster, 'ask')
      await client.zadd(key, Date.now() + 60_000, 'lease')
      // The slot starts moving and the key is migrated: the old node answers ASK, naming the empty node.
      await empty.client.call('CLUSTER', 'SETSLOT', slot, 'IMPORTING', from.id)
      await from.client.call('CLUSTER', 'SETSLOT', slot, 'MIGRATING', empty.id)
      await from.client.call('MIGRATE', '127.0.0.1', empty.port, '', 0, 5_000, 'KEYS', key)
      // ASK adds the node and queues ASKING on its new connection; the command is refused there and retried with a
      // slot refresh, which drops the node (CLUSTER SLOTS does not list it) and closes that connection under the
      // ASKING ("Connection is closed."). Whether the ASKING was answered first is a race the new node usually loses
      // on a loaded machine; stopped for the moment (as a node slow to answer is), it always loses it: the ASKING
      // waits in the queue of a connection that never gets ready, and fails at the drop or at commandTimeout.
      empty.proc.kill('SIGSTOP')
      const resumed = (): void => { empty.proc.kill('SIGCONT') }
      t.teardown(resumed)
      const answers: string[] = []
      const count = async (): Promise<void> => {
        answers.push(await client.zcard(key).then((n) => `zcard ${n}`, (err: Error) => `failed: ${err.message}`))
      }
      await within(Promise.all([count(), count(), count()]), 5_000, 'the first commands redirected by ASK')
      resumed()
      t.ok(answers.every((a) => a === 'zcard 1' || a.startsWith('failed: ')), `each command answered or failed cleanly: ${answers.join(', ')}`)
      // The move completes (SETSLOT NODE everywhere): the store goes on, and finds the key on the new node through
      // MOVED.
      for (const node of [empty, from, ...cluster.nodes.filter((n) => n !== from)]) await node.client.call('CLUSTER', 'SETSLOT', slot, 'NODE', empty.id)
      t.teardown(async () => { await cluster.moveSlot(slot, from) })
      t.equal(await client.zcard(key), 1, 'the key answers from the new node')
      // An ASKING still queued on the stopped node fails at the latest at its commandTimeout (300 ms), a timer inside
      // ioredis with no event to wait on: 500 ms covers it; a rejection left unhandled is reported right after.
      await new Promise((resolve) => setTimeout(resolve, 500))
      t.same(unhandled, [], 'no promise rejection left unhandled (Node would have ended the gateway)')
    })
  })
}
