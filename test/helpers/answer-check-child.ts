/**
 * Loaded with `--import` into each gateway process the test helpers start
 * (processes.ts `nodeArgs`): the gateway's front server is watched like
 * build()'s. A process is killed, not ended: what is wrong with an answer is
 * written at once to this process's file, which the helper that started it
 * reads in its teardown, and the count to the shared count file as it goes.
 */
import { appendFileSync, mkdirSync } from 'node:fs'
import http from 'node:http'
import { syncBuiltinESMExports } from 'node:module'
import { join } from 'node:path'
import { COUNT_FILE, countAsYouGo, precompile, watchAnswers } from './answer-check.js'
import { ANSWER_VIOLATIONS_DIR } from './processes.js'

countAsYouGo()
precompile()
// Counts go out four times a second, not per answer (load tests send thousands); violations at once.
let unwritten = 0
const writeCount = (): void => {
  if (unwritten > 0) appendFileSync(COUNT_FILE, `${process.pid} ${unwritten} 0\n`)
  unwritten = 0
}
setInterval(writeCount, 250).unref()
process.once('exit', writeCount)
// Workers forked by a gateway (GATEWAY_WORKERS) inherit the environment: each writes beside the process the test
// started, `<its pid>-<own pid>.log`, since that process's id is the one the test reads (assertAnswersDeclared).
const PRIMARY = 'ANSWER_CHECK_PRIMARY_PID'
const primary = process.env[PRIMARY] ?? String(process.pid)
process.env[PRIMARY] = primary
const own = join(ANSWER_VIOLATIONS_DIR,
  primary === String(process.pid) ? `${primary}.log` : `${primary}-${process.pid}.log`)
const createServer = http.createServer
http.createServer = function (this: unknown, ...args: unknown[]) {
  const server = (createServer as (...a: unknown[]) => http.Server).apply(this, args)
  // The front server (src/http/front.ts) answers Host itself; the metrics listener is not in the document.
  const options = typeof args[0] === 'object' && args[0] !== null ? args[0] as http.ServerOptions : undefined
  if (options?.requireHostHeader === false) {
    watchAnswers(server, (found) => {
      unwritten++
      if (found.length === 0) return
      mkdirSync(ANSWER_VIOLATIONS_DIR, { recursive: true })
      appendFileSync(own, `${found.join('\n')}\n`)
    })
  }
  return server
} as typeof http.createServer
// front.ts imports createServer by name: its binding follows the module's export once synced.
syncBuiltinESMExports()
