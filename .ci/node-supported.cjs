// Exits 0 when Node.js version $1 (default: the one running) satisfies package.json's engines.node, 1 when not.
// .ci/run asks it before npm ci, so it cannot use the built src/shared/runtime.ts; test/shared/runtime.test.ts
// holds the two to the same answers.
'use strict'
const range = require('../package.json').engines.node
// As runtime.ts: each part read as parseInt does ("0-rc" is 0), a missing part 0.
const parse = (text) => {
  const [major = 0, minor = 0, patch = 0] = text.replace(/^v/, '').split('.').map((n) => Number.parseInt(n, 10))
  return [major, minor, patch]
}
const atLeast = (a, b) => {
  for (let i = 0; i < 3; i++) if (a[i] !== b[i]) return a[i] > b[i]
  return true
}
const v = parse(process.argv[2] || process.versions.node)
const ok = range.split('||').map((r) => r.trim()).some((r) => {
  const floor = parse(r.replace(/^(\^|>=)/, ''))
  return r.startsWith('>=') ? atLeast(v, floor) : v[0] === floor[0] && atLeast(v, floor)
})
process.exit(ok ? 0 : 1)
