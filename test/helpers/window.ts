/**
 * The rate limit counts per clock-aligned window (src/limits/store.ts
 * currentWindow, the same arithmetic in the process and in Redis): a test that
 * counts hits and expects exact numbers, or a refusal past the limit, starts
 * only with `roomMs` left in the window, or else waits for the next one.
 */
import { setTimeout as sleep } from 'node:timers/promises'
import { currentWindow } from '../../src/limits/store.js'

export async function clearOfWindowEdge (roomMs = 10_000, windowMs = 60_000): Promise<void> {
  const { resetMs } = currentWindow(windowMs)
  if (resetMs < roomMs) await sleep(resetMs + 50)
}
