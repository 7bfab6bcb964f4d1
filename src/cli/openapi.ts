/**
 * npm run openapi: write the gateway's OpenAPI document to openapi.json (or
 * the path given), exactly as GET /openapi.json serves it. The app is built
 * but never listens, and its engine is never called.
 */
import '../shared/runtime-guard.js'
import { writeFile } from 'node:fs/promises'
import { openApiDocument } from './openapi-document.js'

const target = process.argv[2] ?? 'openapi.json'
await writeFile(target, await openApiDocument())
process.stdout.write(`wrote ${target}\n`)
