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
      redact: {
        paths: ['req.headers.authorization', 'headers.authorization', 'req.headers.cookie'],
        censor: '[redacted]'
      }
    },
    flush: async () => {
      if ('flush' in stream && typeof stream.flush === 'function') {
        await new Promise<void>((resolve) => (stream.flush as (cb: () => void) => void)(() => resolve()))
      }
    }
  }
}

/** A developer at a terminal reads lines formatted in this process, so they keep their order with the token banner. */
async function destination (config: GatewayConfig): Promise<DestinationStream> {
  if (config.production || process.stdout.isTTY !== true) return jsonLines()
  // Loaded only here: production and piped runs never pay for pino-pretty's modules at start.
  const { prettyFactory } = await import('pino-pretty')
  const pretty = prettyFactory({ colorize: true, translateTime: 'HH:MM:ss.l', ignore: 'pid,hostname' })
  // A closed terminal fails every write with EIO: stop writing rather than raise an error per line while draining.
  let terminalGone = false
  process.stdout.on('error', () => { terminalGone = true })
  return { write: (line: string) => { if (!terminalGone) process.stdout.write(pretty(line)) } }
}

/**
 * Lines leave in batches instead of one blocking write per access line (docs/performance-history.md, "Logging"); a
 * stdout that stops draining loses lines past the bound rather than memory or requests.
 */
function jsonLines (): DestinationStream {
  return pino.destination({ dest: 1, sync: false, minLength: 4096, maxLength: 16 * 1024 * 1024, periodicFlush: 250 })
}
