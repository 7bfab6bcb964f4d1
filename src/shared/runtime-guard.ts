/**
 * Imported first by each entry point: ES modules are evaluated in import order, so this exits with its one
 * line before any dependency that needs a newer Node.js is evaluated.
 */
import { basename } from 'node:path'
import { requireSupportedRuntime } from './runtime.js'

// Each program's lines start with its own name: the reference engine's and the token command's differ.
const PROGRAMS: Readonly<Record<string, string>> = { 'standalone.js': 'portfolio-engine', 'token.js': 'token' }
requireSupportedRuntime(PROGRAMS[basename(process.argv[1] ?? '')] ?? 'portfolio-gateway')
