/** Polling with a deadline, instead of sleeping in the tests. */

import { setTimeout as sleep } from 'node:timers/promises';

export interface WaitOptions {
  timeoutMs?: number;
  intervalMs?: number;
  what?: string;
}

/** `probe()`'s first truthy value, polled until `timeoutMs` has passed (then an error naming `what`). */
export async function waitUntil<T>(
  probe: () => T | Promise<T>,
  { timeoutMs = 10_000, intervalMs = 10, what = 'the condition' }: WaitOptions = {},
): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value) {
      return value as NonNullable<T>;
    }
    if (Date.now() > deadline) {
      throw new Error(`${what} did not happen within ${timeoutMs} ms (last: ${String(value)})`);
    }
    await sleep(intervalMs);
  }
}
