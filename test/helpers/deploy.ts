/**
 * What the deploy checks (test/deploy-*.test.ts) share: the recipe's files,
 * read as YAML or JSON; the PromQL each of them queries; and a skip (or, under
 * CI=true, a failure) with one line when a tool such as promtool is missing.
 */
import { spawnSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import type { Test } from 'tap'
import { parse, parseAllDocuments } from 'yaml'
import { ROOT } from './processes.js'

export const DEPLOY = join(ROOT, 'deploy')

export function toolAvailable (command: string, versionArg = '--version'): boolean {
  return spawnSync(command, [versionArg], { stdio: 'ignore' }).status === 0
}

/** Skip the file's tests with one line naming the package when `command` is missing; under CI that is a failure. */
export function requireTool (t: Test, command: string, debianPackage: string, versionArg = '--version'): boolean {
  if (toolAvailable(command, versionArg)) return true
  const line = `${command} not found: apt-get install ${debianPackage} (Debian/Ubuntu) to run these checks`
  if (process.env['CI'] === 'true') t.fail(line)
  else t.plan(0, line)
  return false
}

/** Run a tool; its status and combined output. */
export function run (command: string, args: string[], cwd = ROOT): { status: number | null; output: string } {
  const result = spawnSync(command, args, { cwd, encoding: 'utf8', timeout: 60_000 })
  return { status: result.status, output: `${result.stdout}${result.stderr}` }
}

export function readYaml (path: string): unknown {
  return parse(readFileSync(join(DEPLOY, path), 'utf8'))
}

/** Every document of a multi-document YAML file. */
export function readYamlDocuments (path: string): unknown[] {
  return parseAllDocuments(readFileSync(join(DEPLOY, path), 'utf8')).map((doc) => {
    if (doc.errors.length > 0) throw new Error(`${path}: ${doc.errors[0]!.message}`)
    return doc.toJS() as unknown
  })
}

export interface AlertRule {
  alert: string
  expr: string
  for?: string
  labels?: Record<string, string>
  annotations?: Record<string, string>
}

export function alertRules (): AlertRule[] {
  const file = readYaml('prometheus/alerts.yml') as { groups: Array<{ rules: AlertRule[] }> }
  return file.groups.flatMap((group) => group.rules)
}

interface DashboardPanel {
  title: string
  type: string
  targets?: Array<{ expr: string }>
  panels?: DashboardPanel[]
}
export interface Dashboard {
  uid: string
  title: string
  panels: DashboardPanel[]
  templating: { list: Array<{ name: string; query?: unknown; definition?: string }> }
}

export function dashboard (): Dashboard {
  return JSON.parse(readFileSync(join(DEPLOY, 'grafana', 'portfolio-gateway.json'), 'utf8')) as Dashboard
}

/** Every panel's PromQL, with its panel's title. */
export function dashboardQueries (): Array<{ title: string; expr: string }> {
  const flat = (panels: DashboardPanel[]): DashboardPanel[] => panels.flatMap((p) => [p, ...flat(p.panels ?? [])])
  return flat(dashboard().panels).flatMap((p) =>
    (p.targets ?? []).map((target) => ({ title: p.title, expr: target.expr }))
  )
}

/** Grafana's variables replaced by what Prometheus would get, so promtool can parse the query. */
export function withoutGrafanaVariables (expr: string): string {
  return expr.replaceAll('$__rate_interval', '5m').replaceAll('$instance', '.*')
}

/**
 * The metric names a PromQL expression reads: identifiers of the gateway's own
 * families, the reference engine's (portfolio_engine_) and prom-client's process ones. Labels, functions and keywords
 * never
 * start with these prefixes. `up` is Prometheus's own (per target), never scraped.
 */
export function metricNames (expr: string): string[] {
  return [...new Set(expr.match(/\b(?:gateway|process|nodejs|portfolio_engine)_[a-zA-Z0-9_]+\b/g) ?? [])]
}
