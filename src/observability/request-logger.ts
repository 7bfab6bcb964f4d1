/**
 * The request's logger (`request.log`), built only when a line is written.
 *
 * Fastify asks its `childLoggerFactory` for a logger per request, and pino's
 * child logger serializes its bindings when it is made: at `warn` that was
 * work for every request whose lines are all below the level (a profile put
 * it at about 4% of the busy time). This logger holds the bindings and
 * writes nothing until a line at an enabled level comes; then:
 * - a line of fields (and a message) goes out through the app's logger with
 *   the bindings merged in front (`reqId`, `traceId` first, where a child
 *   would write them), with no child made;
 * - anything else (an Error or any other object that is not a plain object,
 *   such as a request, whose serializer pino applies; format arguments;
 *   `child()`, `bindings()`) makes the real pino child once and hands it the call.
 * Either way every line that is written carries `reqId` and `traceId`.
 */
import type { IncomingMessage } from 'node:http'
import type { FastifyBaseLogger, FastifyServerOptions } from 'fastify'
import type { Logger } from 'pino'
import { traceIdOf } from './trace-context.js'

type Level = 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal'
/** pino's numbers for its levels (pino.levels.values). */
const LEVEL_VALUE: Readonly<Record<Level, number>> = { trace: 10, debug: 20, info: 30, warn: 40, error: 50, fatal: 60 }

type Bindings = Record<string, unknown>

/**
 * Only a plain object that pino would write as fields is merged. pino treats
 * others by what they are (an Error as `err`; anything with a method, headers
 * and a socket as a request, anything with setHeader as a response, each
 * through its serializer), and merging the bindings into them would lose the
 * bindings or write what the serializers leave out, such as a request's raw
 * headers with its token.
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
    // Below the level: nothing at all is built.
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

/**
 * Fastify's `childLoggerFactory`. A route with its own log level or
 * serializers gets pino's child at once (none has one today).
 */
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
