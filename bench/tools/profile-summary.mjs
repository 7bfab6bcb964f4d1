// Summarise a V8 .cpuprofile: inclusive share of busy (non-idle) samples per function.
// usage: node bench/tools/profile-summary.mjs <dir with one .cpuprofile> [regex filter]
import { readFileSync, readdirSync } from 'node:fs'
const dir = process.argv[2]
const file = readdirSync(dir).find((f) => f.endsWith('.cpuprofile'))
const p = JSON.parse(readFileSync(`${dir}/${file}`))
const byId = new Map(p.nodes.map((n) => [n.id, n]))
const parent = new Map()
for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id)
const t = new Map()
let total = 0
let idle = 0
for (let i = 0; i < p.samples.length; i++) {
  const d = p.timeDeltas[i] ?? 0
  t.set(p.samples[i], (t.get(p.samples[i]) ?? 0) + d)
  total += d
}
const incl = new Map()
for (const [id, d] of t) {
  const n = byId.get(id)
  if (n.callFrame.functionName === '(idle)') {
    idle += d
    continue
  }
  const seen = new Set()
  let cur = id
  while (cur !== undefined) {
    const cf = byId.get(cur).callFrame
    const k = `${cf.functionName || '(anon)'} ${cf.url.replace(/.*node_modules\//, '').replace('file:///work/main/', '')}:${cf.lineNumber}`
    if (!seen.has(k)) {
      seen.add(k)
      incl.set(k, (incl.get(k) ?? 0) + d)
    }
    cur = parent.get(cur)
  }
}
const busy = total - idle
console.log('busy', ((100 * busy) / total).toFixed(1) + '%')
const filt = process.argv[3] ? new RegExp(process.argv[3]) : /./
console.log(
  [...incl]
    .filter(([k]) => filt.test(k))
    .sort((a, b) => b[1] - a[1])
    .slice(0, 45)
    .map(([k, v]) => `${((100 * v) / busy).toFixed(1).padStart(5)}%  ${k}`)
    .join('\n')
)
