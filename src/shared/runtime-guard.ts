/** Imported first by each entry point, so it exits before any dependency that needs a newer Node.js is evaluated. */
import { basename } from 'node:path'
import { requireSupportedRuntime } from './runtime.js'

const PROGRAMS: Readonly<Record<string, string>> = { 'standalone.js': 'portfolio-engine', 'token.js': 'token' }
requireSupportedRuntime(PROGRAMS[basename(process.argv[1] ?? '')] ?? 'portfolio-gateway')
