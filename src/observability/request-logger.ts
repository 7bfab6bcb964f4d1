/**
 * The request's logger (`request.log`). pino's child serializes its bindings when made, work wasted on every request
 * whose lines are all below the level, so this one holds the bindings until a line at an enabled level comes. A line
 * of plain fields goes out through the app's logger with the bindings merged in front; anything else makes the real
 * child once. Either way every line carries `reqId` and `traceId`.
 */
import type { IncomingMessage } from 'node:http'
import type { FastifyBaseLogger, FastifyServerOptions } from 'fastify'
import type { Logger } from 'pino'
import { traceIdOf } from './trace-context.js'

type Level = 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal'
const LEVEL_VALUE: Readonly<Record<Level, number>> = { trace: 10, debug: 20, info: 30, warn: 40, error: 50, fatal: 60 }

type Bindings = Record<string, unknown>

/**
 * Only a plain object pino writes as fields is merged: pino serializes errors, requests and responses by what they
 * are, and merging into those would lose the bindings or write what the serializers leave out, such as a token.
 */
function isPlainFields (value: unknown): value is Record<string, unknown> {
  if (typeof value !== 'object' || value === null) return false
  const proto = Object.getPrototypeOf(value) as unknown
  if (proto !== Object.prototype && proto !== null) return false
  const fields = value as Record<string, unknown>
  return !(
    (fields['method'] !== undefined && fields['headers'] !== undefined && fields['socket'] !== undefined) ||
    typeof fields['setHeader'] === 'function'
  )
}

class RequestLogger {
  readonly #parent: Logger
  readonly #bindings: Bindings
  readonly #raw: IncomingMessage
  #child: FastifyBaseLogger | undefined

  constructor (parent: Logger, bindings: Bindings, raw: IncomingMessage) {
    this.#parent = parent
    this.#bindings = bindings
    this.#raw = raw
  }

  #real (): FastifyBaseLogger {
    this.#child ??= this.#parent.child({ ...this.#bindings, traceId: traceIdOf(this.#raw) })
    return this.#child
  }

  #write (level: Level, args: unknown[]): void {
    if (this.#child !== undefined) {
      ;(this.#child[level] as (...a: unknown[]) => void)(...args)
      return
    }
    if (LEVEL_VALUE[level] < this.#parent.levelVal) return
    const [first, message] = args
    if (args.length === 1 && typeof first === 'string') {
      this.#parent[level]({ ...this.#bindings, traceId: traceIdOf(this.#raw) }, first)
      return
    }
    if (args.length <= 2 && isPlainFields(first) && (message === undefined || typeof message === 'string')) {
      this.#parent[level]({ ...this.#bindings, traceId: traceIdOf(this.#raw), ...first }, message)
      return
    }
    ;(this.#real()[level] as (...a: unknown[]) => void)(...args)
  }

  get level (): string {
    return (this.#child ?? this.#parent).level
  }

  set level (level: string) {
    this.#real().level = level
  }

  get levelVal (): number {
    return ((this.#child ?? this.#parent) as Logger).levelVal
  }

  isLevelEnabled (level: string): boolean {
    return ((this.#child ?? this.#parent) as Logger).isLevelEnabled(level)
  }

  bindings (): Bindings {
    return (this.#real() as Logger).bindings()
  }

  flush (cb?: (err?: Error) => void): void {
    this.#parent.flush(cb)
  }

  trace (...args: unknown[]): void {
    this.#write('trace', args)
  }

  debug (...args: unknown[]): void {
    this.#write('debug', args)
  }

  info (...args: unknown[]): void {
    this.#write('info', args)
  }

  warn (...args: unknown[]): void {
    this.#write('warn', args)
  }

  error (...args: unknown[]): void {
    this.#write('error', args)
  }

  fatal (...args: unknown[]): void {
    this.#write('fatal', args)
  }

  silent (): void {}

  child (bindings: Bindings, options?: object): FastifyBaseLogger {
    return this.#real().child(bindings, options)
  }
}

/** Fastify's `childLoggerFactory`; a route with its own log level or serializers gets pino's child at once. */
export const requestLoggerFactory: NonNullable<FastifyServerOptions['childLoggerFactory']> = function (
  logger,
  bindings,
  opts,
  raw
) {
  if (opts.level !== undefined || opts.serializers !== undefined) {
    return logger.child({ ...bindings, traceId: traceIdOf(raw) }, opts)
  }
  return new RequestLogger(logger as Logger, bindings, raw) as unknown as FastifyBaseLogger
}
