/**
 * deploy/haproxy/haproxy.cfg, the one balancer config of every recipe form
 *: Debian's haproxy accepts it with the variables set and
 * refuses it without them, and its checks see a draining gateway leave before
 * the gateway's 5 s notice ends (docs/operations.md, "Rolling deploys and drain timelines"; DECISIONS 12).
 */
import { spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { makeCertificates } from '../../deploy/local/tls.js'
import { ROOT } from '../helpers/processes.js'
import { GATEWAY_DRAIN } from '../../src/drain-timeline.js'

const CONFIG = join(ROOT, 'deploy', 'haproxy', 'haproxy.cfg')
const MISSING = 'haproxy not found: apt-get install haproxy (Debian/Ubuntu) to check deploy/haproxy/haproxy.cfg'
/** The gateway's drain notice in production (src/drain-timeline.ts). */
const DRAIN_NOTICE_MS = GATEWAY_DRAIN.productionNoticeMs

const haproxyPresent = spawnSync('haproxy', ['-v'], { stdio: 'ignore' }).status === 0
const opensslPresent = spawnSync('openssl', ['version'], { stdio: 'ignore' }).status === 0

function check (env: Record<string, string>): { status: number | null, out: string } {
  const run = spawnSync('haproxy', ['-c', '-f', CONFIG], { env: { PATH: process.env['PATH'] ?? '', ...env }, encoding: 'utf8', timeout: 30_000 })
  return { status: run.status, out: `${run.stdout}${run.stderr}` }
}

t.test('haproxy -c accepts the config with its variables and refuses it without them', async (t) => {
  if (!haproxyPresent || !opensslPresent) {
    if (process.env['CI'] === 'true') t.fail(MISSING)
    else t.plan(0, MISSING)
    return
  }
  const dir = mkdtempSync(join(tmpdir(), 'haproxy-check-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const { haproxyPem } = makeCertificates(dir)
  const env = {
    HAPROXY_HTTPS_BIND: '127.0.0.1:8443',
    HAPROXY_TLS_CERT: haproxyPem,
    HAPROXY_STATS_BIND: '127.0.0.1:8404',
    HAPROXY_STATS_SOCKET: join(dir, 'haproxy.sock'),
    GATEWAY_1: '127.0.0.1:3001',
    GATEWAY_2: '127.0.0.1:3002',
    // A name, as compose gives them: resolved at start, or later through the resolvers section.
    GATEWAY_3: 'gateway-3.invalid:3000'
  }
  const ok = check(env)
  t.equal(ok.status, 0, ok.out)
  t.match(ok.out, /Configuration file is valid/)

  const { HAPROXY_STATS_SOCKET: _socket, ...withoutSocket } = env
  t.equal(check(withoutSocket).status, 0, 'HAPROXY_STATS_SOCKET has a default (compose leaves it unset)')

  const { HAPROXY_HTTPS_BIND: _, ...withoutBind } = env
  const refused = check(withoutBind)
  t.equal(refused.status, 1, 'an unset HAPROXY_HTTPS_BIND is an error, not a listener on a random port')
  t.match(refused.out, /haproxy\.cfg:\d+\] : 'bind' expects/)
})

t.test('the health checks see a draining gateway leave before its listener closes', async (t) => {
  const cfg = readFileSync(CONFIG, 'utf8')
  const server = /^\s*default-server\s+(.*)$/m.exec(cfg)?.[1] ?? ''
  const inter = Number(/\binter (\d+)s\b/.exec(server)?.[1]) * 1000
  const fall = Number(/\bfall (\d+)\b/.exec(server)?.[1])
  t.ok(inter > 0 && fall > 0, `inter and fall are set on default-server: ${server}`)
  // Worst case: the first failing check starts one interval after SIGTERM, then `fall` checks, `inter` apart.
  t.ok(inter + fall * inter < DRAIN_NOTICE_MS, `DOWN within ${inter + fall * inter} ms, before the ${DRAIN_NOTICE_MS} ms notice ends`)
  t.match(cfg, /^\s*http-check expect status 200$/m)
  t.match(cfg, /uri \/health\b/)
  // Retries only when the connection was never made, and never a POST.
  t.match(cfg, /^\s*retry-on conn-failure$/m)
  t.match(cfg, /^\s*option redispatch\b/m)
  t.match(cfg, /^\s*http-request disable-l7-retry if METH_POST$/m)
  t.match(cfg, /bind "\$\{HAPROXY_HTTPS_BIND\}" ssl crt "\$\{HAPROXY_TLS_CERT\}" alpn h2,http\/1\.1/)
  t.match(cfg, /ssl-min-ver TLSv1\.3/)
})
