/**
 * Prometheus for the local topology, from Debian's package. Its config is
 * written at start, because the scrape targets are the ports this run chose;
 * the alert rules are the recipe's one rule file (deploy/prometheus/alerts.yml),
 * loaded when it exists.
 *
 * What it scrapes: each gateway's METRICS_PORT, haproxy's built-in exporter,
 * and itself. The reference engine serves no /metrics, so it is not a target:
 * its health shows in the gateways' engine-call series, and the chaos test
 * asks each engine's /health directly.
 */
import { existsSync, mkdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { httpStatus, httpText, waitUntil, type PartSpec } from './parts.js'

export interface ScrapeTargets {
  gateways: string[]
  haproxy: string
  self: string
}

export function prometheusConfig (targets: ScrapeTargets, ruleFile: string | undefined, intervalS: number): string {
  const job = (name: string, hosts: string[]): string[] => [
    `  - job_name: ${name}`,
    '    static_configs:',
    `      - targets: [${hosts.map((h) => `'${h}'`).join(', ')}]`
  ]
  return [
    '# Written by deploy/local at start: the targets are the ports this run chose.',
    'global:',
    `  scrape_interval: ${intervalS}s`,
    `  evaluation_interval: ${intervalS}s`,
    ...(ruleFile === undefined ? [] : ['rule_files:', `  - '${ruleFile}'`]),
    'scrape_configs:',
    // The job name alerts.yml and the Kubernetes ServiceMonitor use (deploy/prometheus).
    ...job('portfolio-gateway', targets.gateways),
    ...job('haproxy', [targets.haproxy]),
    ...job('prometheus', [targets.self]),
    ''
  ].join('\n')
}

export function prometheusSpec (runDir: string, repoRoot: string, targets: ScrapeTargets, intervalS: number): PartSpec {
  const rules = join(repoRoot, 'deploy', 'prometheus', 'alerts.yml')
  const configFile = join(runDir, 'prometheus.yml')
  writeFileSync(configFile, prometheusConfig(targets, existsSync(rules) ? rules : undefined, intervalS))
  const data = join(runDir, 'prometheus-data')
  mkdirSync(data, { recursive: true })
  return {
    name: 'prometheus',
    command: 'prometheus',
    args: [
      `--config.file=${configFile}`,
      `--storage.tsdb.path=${data}`,
      `--web.listen-address=${targets.self}`,
      '--storage.tsdb.retention.time=1d',
      '--log.level=warn'
    ],
    env: {},
    ready: async () =>
      await waitUntil(
        'prometheus /-/ready',
        async () => (await httpStatus(`http://${targets.self}/-/ready`)) === 200,
        30_000
      )
  }
}

/** `up` for every target Prometheus scrapes, by job and instance. */
export async function upByTarget (address: string): Promise<Array<{ job: string; instance: string; up: number }>> {
  const { status, body } = await httpText(`http://${address}/api/v1/query?query=up`)
  if (status !== 200) throw new Error(`prometheus query up: ${status}`)
  const parsed = JSON.parse(body) as {
    data: { result: Array<{ metric: { job: string; instance: string }; value: [number, string] }> }
  }
  return parsed.data.result.map((r) => ({ job: r.metric.job, instance: r.metric.instance, up: Number(r.value[1]) }))
}
