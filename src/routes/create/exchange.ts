/**
 * One create from admission to its last byte, as named states and one transition table. The table says,
 * for each state and event, the next state and the effects: arming and stopping the engine's clock and
 * the client's minimum rate, taking and giving back the per-user place and the upload connection.
 * The route only says what happened; the order those things may happen in is written here, once.
 */
import type { ServerResponse } from 'node:http'
import { GatewayError, validationError } from '../../http/errors.js'
import type { UploadShare } from '../../limits/upload-share.js'
import type { MinRate } from './min-rate.js'
import { UploadClock } from './upload-clock.js'
import type { UploadTiming } from './upload.js'

export type ExchangeState =
  | 'admitted' | 'claimed' | 'reading-whole' | 'awaiting-invite' | 'invited' | 'sniffing' | 'awaiting-slot' |
  'streaming' | 'awaiting-answer' | 'answered' | 'engine-done' | 'reading-rest' | 'done'

export type ExchangeEvent =
  | 'claim' | 'read-whole' | 'ask-invite' | 'invite' | 'sniff' | 'whole-form' | 'ask-slot' | 'slot' | 'stream' |
  'body-sent' | 'headers' | 'call-over' | 'read-rest' | 'abort' | 'end'

type Effect =
  | 'takePlace' | 'takeSlot' | 'reportWait' | 'writeContinue' | 'watchInvited' | 'armQueue' | 'armAnswer' |
  'stopForGood' | 'stopClock' | 'giveSlot' | 'watchRest' | 'abortCall' | 'givePlace' | 'unwatch'

export interface Transition { readonly to: ExchangeState, readonly effects: readonly Effect[] }

/** Why an exchange ended. */
export type EndReason = 'answered' | 'refused' | 'client-gone' | 'failed'

const stay = (to: ExchangeState, ...effects: Effect[]): Transition => ({ to, effects })
/** Every live state may be aborted (a refusal, a client that left) and ended; neither waits for a step. */
const live = (state: ExchangeState): Partial<Record<ExchangeEvent, Transition>> => ({
  abort: stay(state, 'abortCall'),
  end: stay('done', 'giveSlot', 'givePlace', 'stopClock', 'unwatch')
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
  'awaiting-invite': { ...live('awaiting-invite'), invite: stay('invited', 'takeSlot', 'reportWait', 'writeContinue', 'watchInvited') },
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
    'body-sent': stay('awaiting-answer', 'armAnswer'),
    headers: stay('answered', 'stopForGood'),
    'call-over': stay('engine-done', 'giveSlot')
  },
  'awaiting-answer': {
    ...live('awaiting-answer'),
    headers: stay('answered', 'stopForGood'),
    'call-over': stay('engine-done', 'giveSlot')
  },
  // The engine may answer before the last chunk was written: that chunk's end changes nothing then.
  answered: { ...live('answered'), 'body-sent': stay('answered'), 'call-over': stay('engine-done', 'giveSlot') },
  'engine-done': { ...live('engine-done'), 'body-sent': stay('engine-done'), 'read-rest': stay('reading-rest', 'watchRest') },
  'reading-rest': { ...live('reading-rest'), 'body-sent': stay('reading-rest') },
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
  /** The response the per-user place waits on: it is given back once the answer is out. */
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

export class CreateExchange {
  #state: ExchangeState = 'admitted'
  #endReason: EndReason | undefined
  /** The events that had no row, in order: tests read them; the route logs them. */
  readonly illegal: IllegalTransition[] = []
  readonly #parts: ExchangeParts
  readonly #clock: UploadClock
  readonly #place: Place
  #slot: (() => void) | undefined
  /** An upload connection granted, held once its event is taken. */
  #granted: (() => void) | undefined
  #askedAt = 0
  #waited = 0
  #abortReason: GatewayError | undefined
  /** The form's timing callbacks: the per-chunk ones stay inside the clock, the last is an event. */
  readonly timing: UploadTiming

  constructor (parts: ExchangeParts) {
    this.#parts = parts
    const rate = { watch: parts.minRate, cut: parts.cut }
    this.#clock = new UploadClock(parts.responseTimeoutMs, parts.stallTimeoutMs, rate)
    this.#place = new Place(parts.response)
    const clock = this.#clock
    this.timing = {
      handedOver: (bytes) => { clock.handedOver(bytes) },
      taken: () => { clock.taken() },
      bodySent: () => { this.#fire('body-sent') },
      refused: (err) => { this.abort(err) }
    }
  }

  get state (): ExchangeState { return this.#state }
  get endReason (): EndReason | undefined { return this.#endReason }
  /** Aborts the engine call (and a wait for an upload connection) with the first abort's reason. */
  get signal (): AbortSignal { return this.#clock.signal }
  /** An upload connection is held now (tests). */
  get holdsSlot (): boolean { return this.#slot !== undefined }
  /** The per-user place is held now (tests). */
  get holdsPlace (): boolean { return this.#place.held }

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
   * The create failed with `err`: a refusal of ours aborts the engine request with itself as the
   * reason, so the try is the client's, never the engine's. Returns what the client is told.
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
      case 'watchInvited': clock.invited(this.#parts.received); break
      case 'armQueue': clock.queued(Math.max(1, this.#parts.responseTimeoutMs - this.#waited)); break
      case 'armAnswer': clock.bodySent(); break
      case 'stopForGood': clock.responded(); break
      case 'stopClock': clock.stop(); break
      case 'watchRest': clock.readingRest(this.#parts.received); break
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
