/** npm run openapi: writes openapi.json, or the path given. */
import '../shared/runtime-guard.js'
import { writeFile } from 'node:fs/promises'
import { openApiDocument } from './openapi-document.js'

const target = process.argv[2] ?? 'openapi.json'
await writeFile(target, await openApiDocument())
process.stdout.write(`wrote ${target}\n`)
