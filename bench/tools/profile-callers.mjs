// Who calls a function in a V8 .cpuprofile: the stacks (up to 6 frames) under which samples of
// functions matching the regex were taken, with their share of busy time.
// usage: node bench/tools/profile-callers.mjs <dir with one .cpuprofile> <regex> [frames]
import { readFileSync, readdirSync } from 'node:fs'
const [dir, pattern, framesArg] = process.argv.slice(2)
const frames = Number(framesArg ?? 6)
const file = readdirSync(dir).find(f => f.endsWith('.cpuprofile'))
const p = JSON.parse(readFileSync(`${dir}/${file}`))
const byId = new Map(p.nodes.map(n => [n.id, n]))
const parent = new Map()
for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id)
const re = new RegExp(pattern)
const name = (id) => { const cf = byId.get(id).callFrame; return `${cf.functionName || '(anon)'} ${cf.url.replace(/.*node_modules\//, '').replace(/.*\/dist\//, '')}:${cf.lineNumber}` }
const stacks = new Map(); let busy = 0
for (let i = 0; i < p.samples.length; i++) {
  const d = p.timeDeltas[i] ?? 0
  if (byId.get(p.samples[i]).callFrame.functionName === '(idle)') continue
  busy += d
  let cur = p.samples[i]; const chain = []
  while (cur !== undefined && !re.test(name(cur))) cur = parent.get(cur)
  if (cur === undefined) continue
  for (let k = 0; k < frames && cur !== undefined; k++) { chain.push(name(cur)); cur = parent.get(cur) }
  const key = chain.join('\n    <- ')
  stacks.set(key, (stacks.get(key) ?? 0) + d)
}
for (const [k, v] of [...stacks].sort((a, b) => b[1] - a[1]).slice(0, 8)) console.log(`${(100 * v / busy).toFixed(2)}%  ${k}\n`)
