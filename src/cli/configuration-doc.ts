/**
 * npm run docs:config: write docs/configuration.md (or the path given) from
 * the environment schemas.
 */
import '../shared/runtime-guard.js'
import { writeFile } from 'node:fs/promises'
import { configurationDocument } from './configuration-document.js'

const target = process.argv[2] ?? 'docs/configuration.md'
await writeFile(target, configurationDocument())
process.stdout.write(`wrote ${target}\n`)
