/**
 * Where a gateway process's log lines go: JSON lines on stdout, or readable
 * lines for a developer at a terminal.
 */
import pino, { type DestinationStream } from 'pino'
import type { LogOptions } from './compose.js'
import type { GatewayConfig } from './config.js'

export interface ProcessLog {
  options: LogOptions
  /** Writes out what is still buffered, so no access line is lost on SIGTERM. */
  flush: () => Promise<void>
}

export async function processLog (config: GatewayConfig): Promise<ProcessLog> {
  const stream = await destination(config)
  return {
    options: {
      level: config.logLevel,
      stream,
      // Nothing logs headers today; this keeps a future `req` serializer from leaking tokens.
      redact: { paths: ['req.headers.authorization', 'headers.authorization', 'req.headers.cookie'], censor: '[redacted]' }
    },
    flush: async () => {
      if ('flush' in stream && typeof stream.flush === 'function') {
        await new Promise<void>((resolve) => (stream.flush as (cb: () => void) => void)(() => resolve()))
      }
    }
  }
}

/**
 * A developer at a terminal reads lines, not JSON: pino-pretty formats each line in this process and it
 * is written at once, so lines keep their order with the token banner. Production, and any stdout that
 * is not a terminal (a pipe, a file, a log shipper), gets the JSON lines.
 */
async function destination (config: GatewayConfig): Promise<DestinationStream> {
  if (config.production || process.stdout.isTTY !== true) return jsonLines()
  // Loaded only here: production and piped runs never pay for pino-pretty's modules at start.
  const { prettyFactory } = await import('pino-pretty')
  const pretty = prettyFactory({ colorize: true, translateTime: 'HH:MM:ss.l', ignore: 'pid,hostname' })
  // A terminal that goes away (the developer closed it) fails every write with EIO: stop writing, and
  // let the SIGHUP drain run, rather than raise an uncaught error per line while shutting down.
  let terminalGone = false
  process.stdout.on('error', () => { terminalGone = true })
  return { write: (line: string) => { if (!terminalGone) process.stdout.write(pretty(line)) } }
}

/**
 * pino's asynchronous destination (sonic-boom): lines gather in memory and leave in one write of at
 * least 4 KiB, or every 250 ms when traffic is light, instead of one blocking write(2) per access line
 * (docs/performance-history.md, "Logging"). The buffer is bounded (16 MiB): if stdout stops draining,
 * lines past it are dropped rather than growing memory without limit or blocking requests on the write.
 */
function jsonLines (): DestinationStream {
  return pino.destination({ dest: 1, sync: false, minLength: 4096, maxLength: 16 * 1024 * 1024, periodicFlush: 250 })
}
