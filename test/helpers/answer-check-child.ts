/**
 * Loaded with `--import` into each gateway process the test helpers start
 * (processes.ts `nodeArgs`): the gateway's front server is watched like
 * build()'s. A process is killed, not ended, so each answer is written down
 * as it is checked: its count to the shared count file, what is wrong with
 * it to this process's file, which the helper that started it reads.
 */
import { appendFileSync, mkdirSync } from 'node:fs'
import http from 'node:http'
import { syncBuiltinESMExports } from 'node:module'
import { join } from 'node:path'
import { COUNT_FILE, countAsYouGo, watchAnswers } from './answer-check.js'
import { ANSWER_VIOLATIONS_DIR } from './processes.js'

countAsYouGo()
const own = join(ANSWER_VIOLATIONS_DIR, `${process.pid}.log`)
const createServer = http.createServer
http.createServer = function (this: unknown, ...args: unknown[]) {
  const server = (createServer as (...a: unknown[]) => http.Server).apply(this, args)
  // The front server (src/http/front.ts) answers Host itself; the metrics listener is not in the document.
  const options = typeof args[0] === 'object' && args[0] !== null ? args[0] as http.ServerOptions : undefined
  if (options?.requireHostHeader === false) {
    watchAnswers(server, (found) => {
      appendFileSync(COUNT_FILE, `${process.pid} 1 ${found.length > 0 ? 1 : 0}\n`)
      if (found.length === 0) return
      mkdirSync(ANSWER_VIOLATIONS_DIR, { recursive: true })
      appendFileSync(own, `${found.join('\n')}\n`)
    })
  }
  return server
} as typeof http.createServer
// front.ts imports createServer by name: its binding follows the module's export once synced.
syncBuiltinESMExports()
