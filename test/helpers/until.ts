/**
 * Waiting on state the test cannot be told about (a server's INFO, a counter):
 * polled, never slept on for a fixed time.
 */

/**
 * Call `attempt` until `done` holds of its value or `ms` have passed, every 50 ms;
 * resolves with the last value (the caller asserts on it).
 */
export async function attemptUntil<T> (attempt: () => Promise<T>, done: (value: T) => boolean, ms: number): Promise<T> {
  const deadline = Date.now() + ms
  for (;;) {
    const value = await attempt()
    if (done(value) || Date.now() > deadline) return value
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}
