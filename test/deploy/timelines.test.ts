/**
 * The Kubernetes recipe survives its own rollout (DECISIONS 25): each grace
 * period covers the shutdown the code really follows, the engine's new pods
 * are resolvable before old ones leave, and the timelines written in the
 * manifests' comments are the code's numbers. Every number comes from the code
 * (src/drain-timeline.ts, src/reference-engine/engine-env.ts, src/http/limits.ts)
 * or from the YAML, so neither can drift without this failing.
 */
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import { GATEWAY_DRAIN } from '../../src/drain-timeline.js'
import {
  DRAIN_IDLE_GRACE_MS,
  GATEWAY_HEALTH_INTERVAL_MS,
  IN_FLIGHT_GRACE_MS,
  loadEngineEnv
} from '../../src/reference-engine/engine-env.js'
import { SERVER_LIMITS } from '../../src/http/limits.js'
import { DEPLOY, readYamlDocuments } from '../helpers/deploy.js'
import { ROOT } from '../helpers/processes.js'

interface Container {
  env?: Array<{ name: string; value: string }>
  envFrom?: unknown
  lifecycle?: { preStop?: { exec?: { command: string[] } } }
}
interface Deployment {
  kind: string
  metadata: { name: string }
  spec: {
    minReadySeconds?: number
    template: { spec: { terminationGracePeriodSeconds: number; containers: Container[] } }
  }
}
interface ConfigMap {
  kind: string
  metadata: { name: string }
  data: Record<string, string>
}

/**
 * CoreDNS's answer for a headless Service lives this long in caches: its
 * kubernetes plugin's default `ttl`, a property of the cluster, not of this code.
 */
const COREDNS_TTL_S = 5
/** The endpoints controller and CoreDNS's watch see a pod's readiness change within about a second. */
const PROPAGATION_S = 1

const doc = <T>(file: string, kind: string): T =>
  readYamlDocuments(join('kubernetes', file)).find((d) => (d as { kind: string }).kind === kind) as T
const gateway = doc<Deployment>('gateway-deployment.yaml', 'Deployment')
const engine = doc<Deployment>('engine-deployment.yaml', 'Deployment')
const gatewayConfig = doc<ConfigMap>('gateway-config.yaml', 'ConfigMap')
const commentOf = (file: string): string =>
  readFileSync(join(DEPLOY, 'kubernetes', file), 'utf8').split('\napiVersion:')[0]!

function preStopSleepS (d: Deployment): number {
  const command = d.spec.template.spec.containers[0]!.lifecycle?.preStop?.exec?.command ?? []
  if (command[0] !== 'sleep') throw new Error(`${d.metadata.name}: preStop is not a sleep: ${JSON.stringify(command)}`)
  return Number(command[1])
}

/** The `t = N s` of the comment's timeline line that mentions `what`. */
function timelineAt (comment: string, what: RegExp): number {
  const line = comment.split('\n').find((l) => /^#\s+t = \d+( s)?\s/.test(l) && what.test(l))
  if (line === undefined) throw new Error(`no timeline line matching ${String(what)}`)
  return Number(/t = (\d+)/.exec(line)![1])
}

/** "only an upload longer than [about] N s can be cut" in the comment. */
function cutAfterS (comment: string): number {
  const match = /only (?:an upload|one) longer than (?:about )?(\d+) s can be cut/.exec(comment.replace(/\n#\s*/g, ' '))
  if (match === null) throw new Error('the comment does not say which uploads a rollout can cut')
  return Number(match[1])
}

t.test('the server code shuts down by these constants (no copy of a number in main.ts or standalone.ts)', async (t) => {
  const server = readFileSync(join(ROOT, 'src', 'main.ts'), 'utf8')
  t.match(server, /closeWithGrace\(\{ delay: GATEWAY_DRAIN\.exitDeadlineMs \}/)
  t.match(server, /config\.production \? GATEWAY_DRAIN\.productionNoticeMs : 0/)
  t.match(server, /stopAccepting\(app\.server, GATEWAY_DRAIN\.idleGraceMs\)/)
  const standalone = readFileSync(join(ROOT, 'src', 'reference-engine', 'standalone.ts'), 'utf8')
  t.match(
    standalone,
    /closeWithGrace\(\s*\{ delay: settings\.drainNoticeMs \+ DRAIN_IDLE_GRACE_MS \+ IN_FLIGHT_GRACE_MS \}/
  )
  t.match(standalone, /stopAccepting\(engine\.server, DRAIN_IDLE_GRACE_MS\)/)
})

t.test(
  'gateway pods: preStop + the exit deadline (counted from SIGTERM) fit the grace period, as the comment says',
  async (t) => {
    const pod = gateway.spec.template.spec
    const sleepS = preStopSleepS(gateway)
    const noticeS = GATEWAY_DRAIN.productionNoticeMs / 1000
    const exitS = sleepS + GATEWAY_DRAIN.exitDeadlineMs / 1000
    t.ok(
      pod.terminationGracePeriodSeconds > exitS,
      `terminationGracePeriodSeconds ${pod.terminationGracePeriodSeconds} > ${sleepS} s preStop + ${GATEWAY_DRAIN.exitDeadlineMs / 1000} s`
    )
    const comment = commentOf('gateway-deployment.yaml')
    t.equal(timelineAt(comment, /SIGTERM/), sleepS, 'SIGTERM after the preStop sleep')
    t.equal(timelineAt(comment, /listener closes/), sleepS + noticeS, 'the listener closes after the notice')
    t.equal(timelineAt(comment, /at the latest the process exits/), exitS, 'the exit deadline counts from SIGTERM')
    t.equal(timelineAt(comment, /terminationGracePeriodSeconds/), pod.terminationGracePeriodSeconds)
    t.match(
      comment,
      new RegExp(`up to ${SERVER_LIMITS.requestTimeoutMs / 1000} s`),
      'the longest upload the gateway allows'
    )
    // An upload that reached the pod just before its listener closed has the rest of the deadline.
    t.equal(
      cutAfterS(comment),
      (GATEWAY_DRAIN.exitDeadlineMs - GATEWAY_DRAIN.productionNoticeMs) / 1000,
      'which uploads a gateway rollout can cut'
    )
    t.ok(
      cutAfterS(comment) < SERVER_LIMITS.requestTimeoutMs / 1000,
      'and so a long upload can be cut: docs/operations.md says what the client sees'
    )
  }
)

t.test(
  'engine pods: DNS drops an old pod before its notice, a new one is resolvable before an old one leaves, and the drain fits the grace period',
  async (t) => {
    const pod = engine.spec.template.spec
    const env = Object.fromEntries((pod.containers[0]!.env ?? []).map((e) => [e.name, e.value]))
    // The engine's own reader, on the manifest's values: production, so the production notice.
    const settings = loadEngineEnv(env)
    t.ok(
      settings.drainNoticeMs >= GATEWAY_HEALTH_INTERVAL_MS,
      "the notice covers a gateway's health-check interval (DECISIONS 25)"
    )
    const refreshS = Number(gatewayConfig.data['UPSTREAM_DNS_REFRESH_MS']) / 1000
    t.equal(refreshS, 5, "the gateways resolve again every 5 s (Envoy's default)")
    const seenWithinS = PROPAGATION_S + COREDNS_TTL_S + refreshS
    const sleepS = preStopSleepS(engine)
    t.ok(
      sleepS >= seenWithinS,
      `preStop ${sleepS} s >= ${seenWithinS} s: every gateway has dropped the address before SIGTERM`
    )
    t.ok(
      (engine.spec.minReadySeconds ?? 0) >= seenWithinS,
      `minReadySeconds ${String(engine.spec.minReadySeconds)} >= ${seenWithinS} s: every gateway knows a new pod before an old one goes`
    )

    const noticeS = settings.drainNoticeMs / 1000
    const shutdownS = noticeS + DRAIN_IDLE_GRACE_MS / 1000 + IN_FLIGHT_GRACE_MS / 1000
    const exitS = sleepS + shutdownS
    t.ok(
      pod.terminationGracePeriodSeconds > exitS,
      `terminationGracePeriodSeconds ${pod.terminationGracePeriodSeconds} > ${sleepS} s preStop + ${shutdownS} s`
    )

    const comment = commentOf('engine-deployment.yaml')
    t.match(comment, new RegExp(`minReadySeconds ${String(engine.spec.minReadySeconds)}\\b`))
    t.match(comment, new RegExp(`preStop sleep \\(${sleepS} s\\)`))
    t.equal(timelineAt(comment, /SIGTERM/), sleepS)
    t.equal(timelineAt(comment, /listener closes/), sleepS + noticeS)
    t.equal(timelineAt(comment, /at the latest the process exits/), exitS)
    t.equal(timelineAt(comment, /terminationGracePeriodSeconds/), pod.terminationGracePeriodSeconds)
    t.match(comment, new RegExp(`requests in flight get ${IN_FLIGHT_GRACE_MS / 1000} s`))
    t.match(comment, new RegExp(`up to ${SERVER_LIMITS.requestTimeoutMs / 1000} s`))
    // The last create reaches the pod when the last gateway drops its address; it has until the exit.
    t.equal(cutAfterS(comment), exitS - seenWithinS, 'which uploads an engine rollout can cut')
    t.equal(settings.idempotencyTtlS, 172_800, "the engine keeps its keys 48 h, longer than the gateways' 24 h")
  }
)
