/**
 * The recipe's one dashboard (deploy/grafana/portfolio-gateway.json): it has
 * the panels an operator needs, and every query parses as PromQL (promtool
 * reads each one as a recording rule, Grafana's variables replaced).
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { stringify } from 'yaml'
import { dashboard, dashboardQueries, metricNames, requireTool, run, withoutGrafanaVariables } from '../helpers/deploy.js'

t.test('the dashboard has the sections and metrics an operator looks for', async (t) => {
  const board = dashboard()
  t.equal(board.uid, 'portfolio-gateway')
  const rows = board.panels.filter((p) => p.type === 'row').map((p) => p.title)
  t.same(rows, ['Requests (RED, per route)', 'Engine endpoints', 'Retries and ejections', 'Limits, shedding and uploads', 'Redis', 'Identity provider', 'Process', 'Engines (their own metrics)'])
  const queried = new Set(dashboardQueries().flatMap((q) => metricNames(q.expr)))
  for (const name of [
    'gateway_requests_total', 'gateway_request_duration_seconds_bucket', 'gateway_requests_in_flight',
    'gateway_engine_endpoint_up', 'gateway_engine_calls_total', 'gateway_engine_call_duration_seconds_bucket', 'gateway_engine_pool_connections',
    'gateway_engine_retries_total', 'gateway_engine_retry_budget_exhausted_total', 'gateway_engine_ejections_total',
    'gateway_rejections_total', 'gateway_rate_limit_fail_open_total', 'gateway_idempotency_total',
    'gateway_redis_up', 'gateway_redis_failovers_total', 'gateway_redis_replication_lag_total',
    'gateway_jwks_refreshes_total', 'gateway_jwks_unavailable_total',
    'process_cpu_seconds_total', 'process_resident_memory_bytes', 'nodejs_eventloop_lag_p99_seconds',
    'portfolio_engine_requests_total', 'portfolio_engine_request_duration_seconds_bucket', 'portfolio_engine_store_up', 'portfolio_engine_draining'
  ]) t.ok(queried.has(name), `a panel queries ${name}`)
  const red = dashboardQueries().filter((q) => q.expr.includes('by (route)') || q.expr.includes('by (le, route)'))
  t.ok(red.length >= 4, 'rate, errors, p50 and p99 are per route')
  t.ok(dashboardQueries().every((q) => q.expr.includes('instance=~"$instance"') || q.expr.includes('instance=~"$engine"') || !q.expr.includes('{')), 'every selector follows the Gateway variable, or the Engine one on engine panels')
})

t.test('every panel query parses as PromQL', async (t) => {
  if (!requireTool(t, 'promtool', 'prometheus')) return
  const dir = mkdtempSync(join(tmpdir(), 'dashboard-promql-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const queries = dashboardQueries()
  const rules = queries.map((q, i) => ({ record: `dashboard:query_${i}`, expr: withoutGrafanaVariables(q.expr) }))
  writeFileSync(join(dir, 'queries.yml'), stringify({ groups: [{ name: 'dashboard', rules }] }))
  const { status, output } = run('promtool', ['check', 'rules', join(dir, 'queries.yml')])
  t.equal(status, 0, output)
  t.match(output, `SUCCESS: ${queries.length} rules found`)
})
