/** npm run docs:config: writes docs/configuration.md, or the path given. */
import '../shared/runtime-guard.js'
import { writeFile } from 'node:fs/promises'
import { configurationDocument } from './configuration-document.js'

const target = process.argv[2] ?? 'docs/configuration.md'
await writeFile(target, configurationDocument())
process.stdout.write(`wrote ${target}\n`)
