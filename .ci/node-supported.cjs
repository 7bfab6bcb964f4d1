// Exits 0 when Node.js version $1 (default: the one running) satisfies package.json's engines.node, 1 when not.
// .ci/run asks it before npm ci, so it cannot use the built src/shared/runtime.ts; test/shared/runtime.test.ts
// holds the two to the same answers.
'use strict'
const range = require('../package.json').engines.node
const parse = (text) => text.replace(/^v/, '').split('.').map(Number)
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
