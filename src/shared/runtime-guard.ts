/**
 * Imported first by each entry point: ES modules are evaluated in import order, so this exits with its one
 * line before any dependency that needs a newer Node.js is evaluated.
 */
import { requireSupportedRuntime } from './runtime.js'

requireSupportedRuntime('portfolio-gateway')
