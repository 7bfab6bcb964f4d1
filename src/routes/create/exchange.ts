/**
 * One create from admission to its last byte, as named states and one transition table. The order in which
 * a create's steps may happen is written here once, and the route only reports what happened
 * (decision: a create is one exchange with named states).
 */
import type { ServerResponse } from 'node:http'
import { GatewayError, validationError } from '../../http/errors.js'
import type { UploadShare } from '../../limits/upload-share.js'
import type { MinRate, RateMeter } from './min-rate.js'
import type { UploadTiming } from './upload.js'

export type ExchangeState =
  | 'admitted' | 'claimed' | 'reading-whole' | 'awaiting-invite' | 'invited' | 'sniffing' | 'awaiting-slot' |
  'streaming' | 'awaiting-answer' | 'answered' | 'engine-done' | 'reading-rest' | 'done'

export type ExchangeEvent =
  | 'claim' | 'read-whole' | 'ask-invite' | 'invite' | 'sniff' | 'whole-form' | 'ask-slot' | 'slot' | 'stream' |
  'hand-over' | 'taken' | 'body-sent' | 'headers' | 'call-over' | 'read-rest' | 'abort' | 'end'

type Effect =
  | 'takePlace' | 'takeSlot' | 'reportWait' | 'writeContinue' | 'watchInvited' | 'armQueue' | 'armStall' |
  'disarmStall' | 'armAnswer' | 'stopForGood' | 'stopClock' | 'giveSlot' | 'watchRest' | 'abortCall' |
  'givePlace' | 'unwatch'

export interface Transition { readonly to: ExchangeState, readonly effects: readonly Effect[] }

/** Why an exchange ended. */
export type EndReason = 'answered' | 'refused' | 'client-gone' | 'failed'

const stay = (to: ExchangeState, ...effects: Effect[]): Transition => ({ to, effects })
/** Every live state may be aborted (a refusal, a client that left) and ended; neither waits for a step. */
const live = (state: ExchangeState): Partial<Record<ExchangeEvent, Transition>> => ({
  abort: stay(state, 'abortCall'),
  end: stay('done', 'giveSlot', 'givePlace', 'stopClock', 'unwatch')
})
/** Once the engine has answered, a chunk undici had already pulled times nothing. */
const lateChunks = (state: ExchangeState): Partial<Record<ExchangeEvent, Transition>> => ({
  'hand-over': stay(state),
  taken: stay(state),
  'body-sent': stay(state)
})

/** The one table: a missing (state, event) pair is an illegal transition. */
export const TRANSITIONS: Readonly<Record<ExchangeState, Partial<Record<ExchangeEvent, Transition>>>> = {
  admitted: { ...live('admitted'), claim: stay('claimed', 'takePlace') },
  claimed: {
    ...live('claimed'),
    'read-whole': stay('reading-whole', 'writeContinue'),
    'ask-invite': stay('awaiting-invite'),
    sniff: stay('sniffing')
  },
  'reading-whole': live('reading-whole'),
  'awaiting-invite': {
    ...live('awaiting-invite'),
    invite: stay('invited', 'takeSlot', 'reportWait', 'writeContinue', 'watchInvited')
  },
  invited: { ...live('invited'), sniff: stay('sniffing') },
  sniffing: {
    ...live('sniffing'),
    'whole-form': stay('awaiting-answer', 'stopClock', 'giveSlot'),
    'ask-slot': stay('awaiting-slot'),
    stream: stay('streaming', 'armQueue')
  },
  'awaiting-slot': { ...live('awaiting-slot'), slot: stay('streaming', 'takeSlot', 'reportWait', 'armQueue') },
  streaming: {
    ...live('streaming'),
    'hand-over': stay('streaming', 'armStall'),
    taken: stay('streaming', 'disarmStall'),
    'body-sent': stay('awaiting-answer', 'armAnswer'),
    headers: stay('answered', 'stopForGood'),
    'call-over': stay('engine-done', 'giveSlot')
  },
  'awaiting-answer': {
    ...live('awaiting-answer'),
    headers: stay('answered', 'stopForGood'),
    'call-over': stay('engine-done', 'giveSlot')
  },
  answered: { ...live('answered'), ...lateChunks('answered'), 'call-over': stay('engine-done', 'giveSlot') },
  'engine-done': {
    ...live('engine-done'),
    ...lateChunks('engine-done'),
    'read-rest': stay('reading-rest', 'watchRest')
  },
  'reading-rest': { ...live('reading-rest'), ...lateChunks('reading-rest') },
  // A refusal or a chunk's end that arrives after the end concerns nobody: the call is over.
  done: { abort: stay('done'), 'body-sent': stay('done') }
}

/** An event the table has no row for in the current state. */
export class IllegalTransition extends Error {
  constructor (readonly state: ExchangeState, readonly event: ExchangeEvent) {
    super(`a create in state ${state} cannot take event ${event}`)
    this.name = 'IllegalTransition'
  }
}

/** The row for `event` in `state`; throws IllegalTransition when the table has none. */
export function step (state: ExchangeState, event: ExchangeEvent): Transition {
  const transition = TRANSITIONS[state][event]
  if (transition === undefined) throw new IllegalTransition(state, event)
  return transition
}

export interface ExchangeParts {
  subject: string
  share: UploadShare
  minRate: MinRate
  /** UPSTREAM_TIMEOUT_MS: the wait for an upload connection and the engine's answer. */
  responseTimeoutMs: number
  /** How long the engine may stop reading an upload. */
  stallTimeoutMs: number
  /** The per-user place is given back once this response is out. */
  response: ServerResponse
  /** The client's body reads fail with this (a broken minimum rate). */
  cut: (err: GatewayError) => void
  /** Send `100 Continue` to a client that waits for it (once). */
  invite: () => void
  /** Bytes the client's socket has read so far. */
  received: () => number
  /** Told when the create got its upload connection, and since when it asked. */
  slotWaited?: (askedAt: number) => void
  /** Stop watching the client (the route's listeners). */
  unwatch?: () => void
}

/**
 * A create's one owner. Its public surface is the events the route and the form report (each a row of
 * TRANSITIONS), `signal` for the engine call, `dispose()`, and what tests read: `state`, `endReason`,
 * `illegal`, `holdsSlot`, `holdsPlace`. The timers, the place and the upload connection are private.
 */
export class CreateExchange implements UploadTiming {
  #state: ExchangeState = 'admitted'
  #endReason: EndReason | undefined
  /** The events that had no row, in order: tests read them; the route logs them. */
  readonly illegal: IllegalTransition[] = []
  readonly #parts: ExchangeParts
  readonly #clock: EngineClock
  readonly #place: Place
  #slot: (() => void) | undefined
  /** An upload connection granted, held once its event is taken. */
  #granted: (() => void) | undefined
  #askedAt = 0
  #waited = 0
  #abortReason: GatewayError | undefined
  /** The bytes of the chunk being handed over, for the stall timer and the minimum rate. */
  #chunkBytes = 0

  constructor (parts: ExchangeParts) {
    this.#parts = parts
    this.#clock = new EngineClock(parts.responseTimeoutMs, parts.stallTimeoutMs, parts.minRate, parts.cut)
    this.#place = new Place(parts.response)
  }

  get state (): ExchangeState { return this.#state }
  get endReason (): EndReason | undefined { return this.#endReason }
  /** Aborts the engine call (and a wait for an upload connection) with the first abort's reason. */
  get signal (): AbortSignal { return this.#clock.signal }
  /** An upload connection is held now (tests). */
  get holdsSlot (): boolean { return this.#slot !== undefined }
  /** The per-user place is held now (tests). */
  get holdsPlace (): boolean { return this.#place.held }
  /** What the streamed form reports as its chunks go to the engine: the exchange itself. */
  get timing (): UploadTiming { return this }

  /** The per-user place, or 429: refused before any of the body is read. */
  async claim (): Promise<void> {
    const leave = await this.#parts.share.enter(this.#parts.subject)
    this.#place.leave = leave
    if (this.#state === 'done') {
      this.#place.settled()
      return
    }
    this.#fire('claim')
  }

  /** An idempotent replay: the whole form is read and compared, nothing goes to the engine. */
  readWhole (): void { this.#fire('read-whole') }

  /** A client waiting on `100 Continue` gets an upload connection before it sends a byte. */
  async invite (): Promise<void> {
    this.#fire('ask-invite')
    await this.#takeSlot('invite')
  }

  /** The fields and the image's first bytes are read now. */
  sniff (): void { this.#fire('sniff') }

  /** The whole form is in, with no image to stream: nothing more to time on the client. */
  wholeForm (): void { this.#fire('whole-form') }

  /** The image streams to the engine, once an upload connection is held. */
  async stream (): Promise<void> {
    if (this.#slot !== undefined) {
      this.#fire('stream')
      return
    }
    this.#fire('ask-slot')
    await this.#takeSlot('slot')
  }

  /** A chunk of `bytes` bytes read from the client goes to the engine connection. */
  handedOver (bytes: number): void {
    // After the end the engine call is over: a chunk undici had already pulled concerns nobody.
    if (this.#state === 'done') return
    this.#chunkBytes = bytes
    this.#fire('hand-over')
  }

  /** The engine connection took the chunk: the next wait is on the client again. */
  taken (): void {
    if (this.#state !== 'done') this.#fire('taken')
  }

  /** The last byte of the form has gone to the engine. */
  bodySent (): void { this.#fire('body-sent') }

  /** The form was refused mid-upload: the engine request is abandoned with the refusal as its reason. */
  refused (err: GatewayError): void { this.abort(err) }

  /** The engine's response headers are in: the clock stops for good. */
  responded (): void { this.#fire('headers') }

  /** The engine call settled, either way: its upload connection goes back. */
  callOver (): void { this.#fire('call-over') }

  /** The engine answered; the rest of a keyed form is read under the minimum rate. */
  readRest (): void { this.#fire('read-rest') }

  /** Give the engine call up with `reason`; the first reason stays. */
  abort (reason: GatewayError): void {
    this.#abortReason ??= reason
    this.#fire('abort')
  }

  /** The client left before its whole form was in: its engine request is abandoned. */
  clientLeft (): void {
    this.#endReason ??= 'client-gone'
    this.abort(validationError('the client went away before the form was complete'))
  }

  /**
   * The create failed with `err`: a refusal of ours aborts the engine request with itself as the reason,
   * so the try is the client's, never the engine's. Returns what the client is told.
   */
  fail (err: unknown): unknown {
    if (err instanceof GatewayError) {
      this.#endReason ??= 'refused'
      this.abort(err)
    } else {
      this.#endReason ??= 'failed'
    }
    return err
  }

  /** Give back everything still held; once. */
  dispose (): void {
    if (this.#state === 'done') return
    this.#endReason ??= 'answered'
    this.#fire('end')
  }

  async #takeSlot (event: 'invite' | 'slot'): Promise<void> {
    this.#askedAt = performance.now()
    const release = await this.#parts.share.acquire(this.#parts.responseTimeoutMs, this.#clock.signal)
    if (this.#state === 'done') {
      release()
      return
    }
    this.#granted = release
    this.#waited = performance.now() - this.#askedAt
    this.#fire(event)
  }

  #fire (event: ExchangeEvent): void {
    let transition: Transition
    try {
      transition = step(this.#state, event)
    } catch (err) {
      this.illegal.push(err as IllegalTransition)
      throw err
    }
    this.#state = transition.to
    for (const effect of transition.effects) this.#apply(effect)
  }

  #apply (effect: Effect): void {
    const clock = this.#clock
    switch (effect) {
      case 'takePlace': this.#place.watch(); break
      case 'takeSlot': this.#slot = this.#granted; this.#granted = undefined; break
      case 'reportWait': this.#parts.slotWaited?.(this.#askedAt); break
      case 'writeContinue': this.#parts.invite(); break
      case 'watchInvited': clock.watchInvited(this.#parts.received); break
      case 'armQueue': clock.armQueue(Math.max(1, this.#parts.responseTimeoutMs - this.#waited)); break
      case 'armStall': clock.armStall(this.#chunkBytes); break
      case 'disarmStall': clock.disarmStall(); break
      case 'armAnswer': clock.armAnswer(); break
      case 'stopForGood': clock.stopForGood(); break
      case 'stopClock': clock.stop(); break
      case 'watchRest': clock.watchRest(this.#parts.received); break
      case 'abortCall': if (this.#abortReason !== undefined) clock.abort(this.#abortReason); break
      case 'giveSlot': this.#giveSlot(); break
      case 'givePlace': this.#place.settled(); break
      case 'unwatch': this.#parts.unwatch?.(); break
    }
  }

  #giveSlot (): void {
    const release = this.#slot ?? this.#granted
    this.#slot = this.#granted = undefined
    release?.()
  }
}

/**
 * The engine's timers and the client's minimum rate, moved only by the exchange's effects. undici's
 * headersTimeout follows socket activity while a body is written, so a streamed upload keeps this exact clock:
 * `UPSTREAM_TIMEOUT_MS` while the call waits for a connection and again once the engine has the whole form, a
 * stall limit while it takes the upload, and nothing once its headers are in. A limit aborts the engine call.
 */
class EngineClock {
  readonly #abort = new AbortController()
  readonly #responseTimeoutMs: number
  readonly #stallTimeoutMs: number
  readonly #minRate: MinRate
  readonly #cut: (err: GatewayError) => void
  #timer: NodeJS.Timeout | undefined
  #responded = false
  #stopped = false
  #meter: RateMeter | undefined
  #sending = false

  constructor (responseTimeoutMs: number, stallTimeoutMs: number, minRate: MinRate, cut: (err: GatewayError) => void) {
    this.#responseTimeoutMs = responseTimeoutMs
    this.#stallTimeoutMs = stallTimeoutMs
    this.#minRate = minRate
    this.#cut = cut
  }

  get signal (): AbortSignal { return this.#abort.signal }

  /** Stops for good first: a timer left armed would hold the request's objects, and a closing process. */
  abort (reason: GatewayError): void {
    this.stop()
    this.#abort.abort(reason)
  }

  /** Until the engine takes the first bytes, the call waits for a pool connection, and that wait counts. */
  armQueue (remainingMs: number): void {
    this.#arm(remainingMs, 'portfolio engine timed out')
  }

  /** The response body is bounded by undici's bodyTimeout instead. */
  stopForGood (): void {
    this.#responded = true
    this.stop()
  }

  /** An invited client holds its connection from the invitation: its socket's bytes count until a chunk goes. */
  watchInvited (received: () => number): void {
    this.#startMeter()
    this.#meter?.countReceived(received)
  }

  /** The client holds an engine connection from its first chunk; the engine must keep reading. */
  armStall (bytes: number): void {
    if (this.#responded || this.#stopped) return
    this.#startMeter()
    const meter = this.#meter
    if (meter !== undefined) {
      meter.countReceived(undefined)
      meter.bytes += bytes
      meter.onEngine = true
    }
    this.#arm(this.#stallTimeoutMs, 'portfolio engine stopped reading the upload')
  }

  /** Waiting on the client again: the engine's backpressure is never blamed on it. */
  disarmStall (): void {
    if (this.#meter !== undefined) this.#meter.onEngine = false
    clearTimeout(this.#timer)
    this.#timer = undefined
  }

  armAnswer (): void {
    this.#stopMeter()
    this.#arm(this.#responseTimeoutMs, 'portfolio engine timed out')
  }

  /** After stop(): a keyed form's rest is read under the minimum rate, which is how a stalled client is cut off. */
  watchRest (received: () => number): void {
    if (this.#meter === undefined) this.#watchClient().countReceived(received)
  }

  stop (): void {
    this.#stopped = true
    this.#stopMeter()
    clearTimeout(this.#timer)
    this.#timer = undefined
  }

  #startMeter (): void {
    if (this.#sending || this.#responded || this.#stopped) return
    this.#sending = true
    this.#watchClient()
  }

  /** Breaking the rule aborts the engine call (a no-op once it has answered) and fails the client's reads. */
  #watchClient (): RateMeter {
    const meter = this.#minRate.watch((err) => {
      this.#meter = undefined
      this.#abort.abort(err)
      this.#cut(err)
    })
    this.#meter = meter
    return meter
  }

  #stopMeter (): void {
    this.#meter?.stop()
    this.#meter = undefined
  }

  #arm (ms: number, message: string): void {
    clearTimeout(this.#timer)
    if (this.#responded || this.#stopped) return
    this.#timer = setTimeout(() => this.#abort.abort(new GatewayError('UPSTREAM_TIMEOUT', message)), ms)
  }
}

/** A create's place under the per-user cap: given back once both its handler has settled and its answer is out. */
class Place {
  leave: (() => void) | undefined
  #settled = false
  #sent = false
  readonly #response: ServerResponse

  constructor (response: ServerResponse) {
    this.#response = response
  }

  get held (): boolean { return this.leave !== undefined && !(this.#settled && this.#sent) }

  /** Told when the answer is out, or the socket gone. */
  watch (): void {
    this.#response.once('finish', this.#onSent).once('close', this.#onSent)
  }

  readonly #onSent = (): void => {
    this.#sent = true
    this.#release()
  }

  settled (): void {
    this.#settled = true
    // An answer written before the handler settled, or a socket already gone, fires no event now.
    if (this.#response.writableFinished || this.#response.destroyed) this.#sent = true
    this.#release()
  }

  #release (): void {
    if (this.#settled && this.#sent) this.leave?.()
  }
}
