/**
 * Deploy/kubernetes/: every manifest validates against
 * the Kubernetes API's published schemas (the npm packages kubernetes-models and
 * @kubernetes-models/prometheus-operator, which compile them), kustomization.yaml
 * lists every file, and the parts fit together: the drain arithmetic, the probes,
 * the headless engine Service the gateway resolves, the monitor's selector.
 * No cluster runs here: this is what can be checked without one.
 */
import { readdirSync } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import { DEPLOY, readYaml, readYamlDocuments } from '../helpers/deploy.js'
import { GATEWAY_DRAIN } from '../../src/drain-timeline.js'

interface Manifest {
  apiVersion: string
  kind: string
  metadata: { name: string; labels?: Record<string, string> }
  spec?: Record<string, unknown>
  data?: Record<string, string>
  stringData?: Record<string, string>
}
interface Probe {
  httpGet?: { path: string; port: string }
  tcpSocket?: unknown
  periodSeconds?: number
  failureThreshold?: number
  timeoutSeconds?: number
}
interface Container {
  name: string
  command?: string[]
  ports?: Array<{ name: string; containerPort: number }>
  readinessProbe?: Probe
  livenessProbe?: Probe
  lifecycle?: { preStop?: { exec?: { command: string[] } } }
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> }
  securityContext?: { readOnlyRootFilesystem?: boolean; allowPrivilegeEscalation?: boolean }
  volumeMounts?: Array<{ name: string; mountPath: string }>
  env?: Array<{ name: string; value: string }>
}
interface PodSpec {
  terminationGracePeriodSeconds?: number
  securityContext?: { runAsNonRoot?: boolean }
  containers: Container[]
  volumes?: Array<{ name: string; emptyDir?: unknown }>
}
interface Validator {
  validate: () => void
}

const DIR = join(DEPLOY, 'kubernetes')
const files = readdirSync(DIR)
  .filter((f) => f.endsWith('.yaml') && f !== 'kustomization.yaml')
  .sort()
const manifests = files.flatMap((file) =>
  readYamlDocuments(join('kubernetes', file)).map((doc) => ({ file, doc: doc as Manifest }))
)
const find = (kind: string, name: string): Manifest => {
  const found = manifests.find((m) => m.doc.kind === kind && m.doc.metadata.name === name)
  if (found === undefined) throw new Error(`no ${kind} ${name}`)
  return found.doc
}
const podSpec = (m: Manifest): PodSpec => (m.spec as { template: { spec: PodSpec } }).template.spec

/** The gateway's drain (src/drain-timeline.ts): the production notice, and the exit deadline counted from SIGTERM. */
const DRAIN_NOTICE_S = GATEWAY_DRAIN.productionNoticeMs / 1000
const EXIT_DEADLINE_S = GATEWAY_DRAIN.exitDeadlineMs / 1000

/**
 * Keys the schema does not know, like kubeconform's -strict: the API's OpenAPI
 * schemas allow unknown fields (the API server drops them, so a misspelt
 * `readinesProbe` would vanish silently). The compiled validator reads every
 * property its schema names, and every key of a free-form map, so a key it never
 * read is one the schema does not have. Only the outermost unknown key is named.
 */
function unknownFields (Model: new (data: unknown) => Validator, doc: unknown): string[] {
  const instance = new Model(doc) // a deep copy of the plain data
  const reads = new WeakMap<object, Set<string>>()
  const proxies = new WeakMap<object, object>()
  const watch = (value: unknown): unknown => {
    if (value === null || typeof value !== 'object') return value
    const known = proxies.get(value)
    if (known !== undefined) return known
    reads.set(value, new Set())
    const proxy = new Proxy(value, {
      get (target, key, receiver) {
        if (typeof key === 'string') reads.get(target)!.add(key)
        return watch(Reflect.get(target, key, receiver))
      }
    })
    proxies.set(value, proxy)
    return proxy
  }
  Model.prototype.validate.call(watch(instance))
  const unread: string[] = []
  const walk = (value: unknown, path: string): void => {
    if (value === null || typeof value !== 'object') return
    for (const [key, child] of Object.entries(value)) {
      if (!Array.isArray(value) && reads.get(value)?.has(key) !== true) unread.push(`${path}.${key}`)
      else walk(child, `${path}.${key}`)
    }
  }
  walk(instance, '')
  return unread
}

/** The kubernetes-models class for a manifest's apiVersion and kind, from the package's published schemas. */
async function modelFor (apiVersion: string, kind: string): Promise<new (data: unknown) => Validator> {
  const [group, version] = apiVersion.includes('/') ? (apiVersion.split('/') as [string, string]) : ['', apiVersion]
  const path =
    group === 'monitoring.coreos.com'
      ? `@kubernetes-models/prometheus-operator/${group}/${version}/${kind}`
      : `kubernetes-models/${group === '' ? '' : `${group}/`}${version}/${kind}`
  const module = (await import(path)) as Record<string, new (data: unknown) => Validator>
  const model = module[kind]
  if (model === undefined) throw new Error(`${path} exports no ${kind}`)
  return model
}

t.test('kustomization.yaml lists every manifest in the folder, and only those', async (t) => {
  const kustomization = readYaml('kubernetes/kustomization.yaml') as { namespace: string; resources: string[] }
  t.same([...kustomization.resources].sort(), files)
  t.equal(kustomization.namespace, 'portfolio')
})

t.test('every manifest validates against the Kubernetes schemas', async (t) => {
  t.ok(manifests.length >= 14, `${manifests.length} objects`)
  for (const { file, doc } of manifests) {
    const Model = await modelFor(doc.apiVersion, doc.kind)
    t.doesNotThrow(() => {
      new Model(doc).validate()
    }, `${file}: ${doc.kind} ${doc.metadata.name}`)
    t.same(
      unknownFields(Model, doc),
      [],
      `${file}: ${doc.kind} ${doc.metadata.name} has no field the schema does not know`
    )
  }
  const Deployment = await modelFor('apps/v1', 'Deployment')
  const broken = structuredClone(find('Deployment', 'portfolio-gateway')) as Manifest & { spec: { replicas: unknown } }
  broken.spec.replicas = 'three'
  t.throws(() => {
    new Deployment(broken).validate()
  }, 'and the validator refuses a wrong type, so it checks something')
  const ServiceMonitor = await modelFor('monitoring.coreos.com/v1', 'ServiceMonitor')
  const monitor = structuredClone(find('ServiceMonitor', 'portfolio-gateway')) as Manifest & {
    spec: { endpoints: Array<{ interval: string }> }
  }
  monitor.spec.endpoints[0]!.interval = 'often'
  t.throws(() => {
    new ServiceMonitor(monitor).validate()
  }, 'the prometheus-operator schemas too')
  const misspelt = structuredClone(find('Deployment', 'portfolio-gateway')) as Manifest & {
    spec: { template: { spec: { containers: Array<Record<string, unknown>> } } }
  }
  const container = misspelt.spec.template.spec.containers[0]!
  container['readinesProbe'] = container['readinessProbe']
  delete container['readinessProbe']
  t.same(
    unknownFields(Deployment, misspelt),
    ['.spec.template.spec.containers.0.readinesProbe'],
    'and a misspelt field is named'
  )
})

t.test('the gateway pod leaves within its grace period: preStop + notice + requests in flight', async (t) => {
  const pod = podSpec(find('Deployment', 'portfolio-gateway'))
  const gateway = pod.containers[0]!
  const preStop = gateway.lifecycle?.preStop?.exec?.command
  t.same(preStop?.slice(0, 1), ['sleep'])
  const sleepS = Number(preStop?.[1])
  t.ok(sleepS >= 3, 'the preStop sleep covers kube-proxy and Ingress learning that the pod is gone')
  t.ok(
    pod.terminationGracePeriodSeconds! > sleepS + EXIT_DEADLINE_S,
    `terminationGracePeriodSeconds ${String(pod.terminationGracePeriodSeconds)} > ${sleepS} + ${EXIT_DEADLINE_S} (test/deploy/timelines.test.ts has the rest)`
  )
  t.same(
    gateway.readinessProbe?.httpGet,
    { path: '/health', port: 'http' },
    'readiness on /health (500 while draining)'
  )
  t.same(
    gateway.livenessProbe?.httpGet,
    { path: '/ping', port: 'http' },
    'liveness on /ping (a draining pod is not restarted)'
  )
  const readiness = gateway.readinessProbe!
  t.ok(
    readiness.periodSeconds! * readiness.failureThreshold! + (readiness.timeoutSeconds ?? 1) <= DRAIN_NOTICE_S,
    'readiness sees the drain within the notice'
  )
})

t.test('the gateway runs non-root on a read-only root filesystem with a /tmp of its own, with resources', async (t) => {
  for (const name of ['portfolio-gateway', 'portfolio-engine']) {
    const pod = podSpec(find('Deployment', name))
    const container = pod.containers[0]!
    t.equal(pod.securityContext?.runAsNonRoot, true, `${name} non-root`)
    t.equal(container.securityContext?.readOnlyRootFilesystem, true, `${name} read-only root`)
    t.equal(container.securityContext?.allowPrivilegeEscalation, false)
    const tmp = container.volumeMounts?.find((m) => m.mountPath === '/tmp')
    t.ok(
      tmp !== undefined && pod.volumes?.find((v) => v.name === tmp.name)?.emptyDir !== undefined,
      `${name} /tmp is an emptyDir`
    )
    t.ok(
      container.resources?.requests?.['cpu'] !== undefined && container.resources.limits?.['memory'] !== undefined,
      `${name} requests CPU (for the HPA) and bounds memory`
    )
  }
})

t.test('the engines are found through a headless Service, and drain on their own probes', async (t) => {
  const service = find('Service', 'portfolio-engine')
  t.equal(service.spec?.['clusterIP'], 'None', 'headless: the name resolves to every ready pod (DECISIONS 24)')
  const config = find('ConfigMap', 'portfolio-gateway')
  t.equal(new URL(config.data!['UPSTREAM_URL']!).hostname, 'portfolio-engine', 'the gateway resolves that name')
  const engine = podSpec(find('Deployment', 'portfolio-engine')).containers[0]!
  t.same(engine.command, ['node', 'dist/src/reference-engine/standalone.js'])
  t.same(engine.readinessProbe?.httpGet, { path: '/health', port: 'http' })
  t.equal(engine.livenessProbe?.httpGet, undefined, 'liveness is not /health, which answers 500 while draining')
  const env = Object.fromEntries((engine.env ?? []).map((e) => [e.name, e.value]))
  t.equal(env['ENGINE_REDIS_URL'], 'redis://portfolio-engine-redis:6379', 'their own Redis')
  find('Service', 'portfolio-engine-redis')
  t.same(
    (find('PersistentVolumeClaim', 'portfolio-engine-images').spec as { accessModes: string[] }).accessModes,
    ['ReadWriteMany'],
    'one image directory for every engine pod'
  )
})

t.test('Service, PDB, HPA and ServiceMonitor point at the gateway pods', async (t) => {
  const labels = (
    find('Deployment', 'portfolio-gateway').spec as { template: { metadata: { labels: Record<string, string> } } }
  ).template.metadata.labels
  const service = find('Service', 'portfolio-gateway').spec as {
    selector: Record<string, string>
    ports: Array<{ name: string; targetPort: string }>
  }
  t.same(service.selector, labels)
  t.same(
    service.ports.map((p) => `${p.name}->${p.targetPort}`),
    ['http->http', 'metrics->metrics']
  )
  t.same(
    (find('PodDisruptionBudget', 'portfolio-gateway').spec as { selector: { matchLabels: unknown } }).selector
      .matchLabels,
    labels
  )
  const hpa = find('HorizontalPodAutoscaler', 'portfolio-gateway').spec as {
    scaleTargetRef: { kind: string; name: string }
    minReplicas: number
    metrics: Array<{ resource: { name: string } }>
  }
  t.same(hpa.scaleTargetRef, { apiVersion: 'apps/v1', kind: 'Deployment', name: 'portfolio-gateway' })
  t.ok(hpa.minReplicas >= 2, 'never fewer than two, so the PDB lets one drain')
  t.equal(hpa.metrics[0]?.resource.name, 'cpu')
  const monitor = find('ServiceMonitor', 'portfolio-gateway').spec as {
    selector: { matchLabels: Record<string, string> }
    endpoints: Array<{ port: string }>
  }
  t.same(monitor.selector.matchLabels, find('Service', 'portfolio-gateway').metadata.labels)
  t.equal(monitor.endpoints[0]?.port, 'metrics', 'the metrics listener, never the public port')
  const secret = find('Secret', 'portfolio-gateway')
  t.equal(secret.stringData?.['JWT_SECRET'], '', 'no published secret: an unedited copy fails at start')
})
