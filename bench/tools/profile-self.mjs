// Summarise a V8 .cpuprofile by self time: share of busy (non-idle) samples spent in each function itself,
// and the same grouped by package (node internals, fastify, pino, undici, the gateway's own files).
// usage: node bench/tools/profile-self.mjs <dir with one .cpuprofile> [top N]
import { readFileSync, readdirSync } from 'node:fs'
const dir = process.argv[2]
const top = Number(process.argv[3] ?? 30)
const file = readdirSync(dir).find(f => f.endsWith('.cpuprofile'))
const p = JSON.parse(readFileSync(`${dir}/${file}`))
const byId = new Map(p.nodes.map(n => [n.id, n]))
const self = new Map(); const pkg = new Map(); let total = 0; let idle = 0
const where = (url) => url === '' ? '(native)' : url.startsWith('node:') ? 'node' : /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(url)?.[1] ?? url.replace(/.*\/dist\//, 'gateway:').replace(/\/[^/]*$/, '')
for (let i = 0; i < p.samples.length; i++) {
  const d = p.timeDeltas[i] ?? 0; total += d
  const cf = byId.get(p.samples[i]).callFrame
  if (cf.functionName === '(idle)') { idle += d; continue }
  const k = `${cf.functionName || '(anon)'} ${cf.url.replace(/.*node_modules\//, '').replace(/.*\/dist\//, '')}:${cf.lineNumber}`
  self.set(k, (self.get(k) ?? 0) + d)
  const w = cf.functionName === '(garbage collector)' ? '(gc)' : where(cf.url)
  pkg.set(w, (pkg.get(w) ?? 0) + d)
}
const busy = total - idle
const fmt = (m) => [...m].sort((a, b) => b[1] - a[1]).slice(0, top).map(([k, v]) => `${(100 * v / busy).toFixed(1).padStart(5)}%  ${k}`).join('\n')
console.log(`busy ${(100 * busy / total).toFixed(1)}% of ${(total / 1e6).toFixed(1)} s\n-- self time by function\n${fmt(self)}\n-- self time by package\n${fmt(pkg)}`)
