/**
 * The recipe's one rule file (deploy/prometheus/alerts.yml), checked with the
 * Real promtool: it parses, its unit tests pass and fire
 * every alert, the compose Prometheus config loads it, and the Kubernetes
 * PrometheusRule embeds exactly the same groups.
 */
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import { alertRules, DEPLOY, readYaml, requireTool, run } from '../helpers/deploy.js'
import { ROOT } from '../helpers/processes.js'

interface RuleTests { tests: Array<{ alert_rule_test?: Array<{ alertname: string, exp_alerts: unknown[] }> }> }

t.test('the rule file and the Kubernetes PrometheusRule hold the same groups', async (t) => {
  const file = readYaml('prometheus/alerts.yml') as { groups: unknown }
  const rule = readYaml('kubernetes/prometheus-rule.yaml') as { kind: string, spec: { groups: unknown } }
  t.equal(rule.kind, 'PrometheusRule')
  t.same(rule.spec.groups, file.groups, 'deploy/kubernetes/prometheus-rule.yaml spec.groups == deploy/prometheus/alerts.yml groups')
})

t.test('every alert has a severity, a summary, a description and a runbook paragraph in docs/operations.md', async (t) => {
  const operations = readFileSync(join(ROOT, 'docs', 'operations.md'), 'utf8')
  const start = operations.indexOf('\n## Alerts\n')
  t.ok(start >= 0, 'docs/operations.md has a "## Alerts" section')
  const next = operations.indexOf('\n## ', start + 1)
  const alerts = operations.slice(start, next < 0 ? undefined : next)
  const rules = alertRules()
  t.ok(rules.length >= 16, `${rules.length} alerts`)
  t.same([...new Set(rules.map((r) => r.alert))].length, rules.length, 'names are unique')
  for (const rule of rules) {
    t.match(rule.labels?.['severity'], /^(page|ticket)$/, `${rule.alert} severity`)
    t.ok((rule.annotations?.['summary'] ?? '').length > 10, `${rule.alert} summary`)
    t.ok((rule.annotations?.['description'] ?? '').length > 10, `${rule.alert} description`)
    t.equal(rule.annotations?.['runbook'], `docs/operations.md#alerts, ${rule.alert}`, `${rule.alert} runbook`)
    t.ok(alerts.includes(`**${rule.alert}**`), `docs/operations.md "Alerts" says what to do when ${rule.alert} fires`)
  }
})

t.test('the unit tests fire every alert at least once and check each for silence too', async (t) => {
  const tests = readYaml('prometheus/alerts.test.yml') as RuleTests
  const cases = tests.tests.flatMap((group) => group.alert_rule_test ?? [])
  for (const { alert } of alertRules()) {
    t.ok(cases.some((c) => c.alertname === alert && c.exp_alerts.length > 0), `${alert} fires in a test`)
    t.ok(cases.some((c) => c.alertname === alert && c.exp_alerts.length === 0), `${alert} stays silent in a test`)
  }
})

t.test('promtool', async (t) => {
  if (!requireTool(t, 'promtool', 'prometheus')) return

  t.test('check rules accepts the rule file', async (t) => {
    const { status, output } = run('promtool', ['check', 'rules', join(DEPLOY, 'prometheus', 'alerts.yml')])
    t.equal(status, 0, output)
    t.match(output, `SUCCESS: ${alertRules().length} rules found`)
  })

  t.test('test rules passes the unit tests', async (t) => {
    const { status, output } = run('promtool', ['test', 'rules', 'alerts.test.yml'], join(DEPLOY, 'prometheus'))
    t.equal(status, 0, output)
    t.match(output, 'SUCCESS')
  })

  t.test('check config accepts the compose Prometheus config and the rule file it loads', async (t) => {
    const { status, output } = run('promtool', ['check', 'config', join(DEPLOY, 'prometheus', 'prometheus.yml')])
    t.equal(status, 0, output)
    t.match(output, '1 rule files found')
  })
})
