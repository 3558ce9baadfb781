/**
 * The DBOS application the client's tests run, in the test process and in the short-lived "dead executor" processes
 * of the recovery tests (`dead-executor.ts`). Workflows and steps are registered at import, with explicit names:
 * the test process and its children register the same ones, so a workflow a child started can be recovered and run
 * by the test process.
 */

import { randomUUID } from 'node:crypto';
import { DBOS } from '@dbos-inc/dbos-sdk';

export const APP_NAME = 'relay-client-tests';
export const VERSION = 'v1';
export const WORK_QUEUE = 'work'; // listened to by the test process
export const PARKED_QUEUE = 'parked'; // listened to by no process: what is enqueued on it stays ENQUEUED
const WAIT_SECONDS = 30; // the longest a waiter waits for its message (every test sends it long before)

export async function launch(systemDatabaseUrl: string, executorID: string): Promise<void> {
  DBOS.setConfig({
    name: APP_NAME,
    systemDatabaseUrl,
    applicationVersion: VERSION,
    executorID,
    listenQueues: [WORK_QUEUE],
    logLevel: process.env['RELAY_DBOS_TEST_LOG'] ?? 'error',
  });
  await DBOS.launch();
}

/** A value no other execution of the step returns: a step that was run again is told from a copied one. */
export const token = DBOS.registerStep(async () => randomUUID(), { name: 'token' });

export const broken = DBOS.registerStep(
  async (): Promise<void> => {
    throw new Error(`broken ${randomUUID()}`);
  },
  { name: 'broken', retriesAllowed: false },
);

export const greet = DBOS.registerWorkflow(async (name: string) => `hello ${name} ${await token()}`, {
  name: 'greet',
});

/** Step 0 succeeds, step 1 fails (caught), step 2 succeeds: the last failed step is not the last step. */
export const caughtFailure = DBOS.registerWorkflow(
  async () => {
    const first = await token();
    try {
      await broken();
    } catch {
      // caught: the workflow goes on
    }
    return first + (await token());
  },
  { name: 'caught_failure' },
);

/** Step 0 succeeds, step 1 fails the workflow (ERROR). */
export const failing = DBOS.registerWorkflow(
  async () => {
    await token();
    await broken();
  },
  { name: 'failing' },
);

/** PENDING until a message on `topic` is sent to it. */
export const waiter = DBOS.registerWorkflow(async (topic: string) => DBOS.recv<string>(topic, WAIT_SECONDS), {
  name: 'waiter',
});

export const withEvent = DBOS.registerWorkflow(
  async (key: string, value: string) => {
    await DBOS.setEvent(key, value);
  },
  { name: 'with_event' },
);

/** The workflow of the tests' schedules. */
export const tick = DBOS.registerWorkflow(
  async (scheduledAt: Date, _context: unknown) => {
    await DBOS.setEvent('scheduled_at', scheduledAt.toISOString());
  },
  { name: 'tick' },
);
