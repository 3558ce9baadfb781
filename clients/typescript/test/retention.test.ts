/**
 * Retention on the SDK's public API: garbage collection by `completed_at` and by row count, in batches, and the
 * global timeout; the `retention` request that starts a round in the background.
 *
 * Workflows are made old by writing their epoch-ms columns in the system database (`DbosEnv.setTimes`). Each test
 * works in a time range of its own, in 2001, far before anything the other tests run, and deletes what it made.
 */

import * as assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, afterEach, before, describe, test } from 'node:test';
import { DBOS } from '@dbos-inc/dbos-sdk';
import { FINISHED, type Round, type RoundInput, drain, isoAt, runRound } from '../src/retention';
import { Asker } from './support/ask';
import * as app from './support/app';
import { DbosEnv, Lines } from './support/env';
import { waitUntil } from './support/wait';

const Y2001 = 978_307_200_000; // 2001-01-01T00:00:00Z in epoch ms
const env = new DbosEnv();
let made: string[] = []; // the ids a test made: deleted at its end, so that no test's old workflows are another's

before(() => env.start());
after(() => env.stop());
afterEach(async () => {
  if (made.length > 0) {
    await DBOS.deleteWorkflows(made);
  }
  made = [];
});

function round(input: Partial<RoundInput>) {
  return runRound({ gcCutoffEpochMs: null, gcRowsThreshold: null, gcBatchSize: null, timeoutCutoffEpochMs: null, ...input });
}

async function workflows(count: number, name = 'old'): Promise<string[]> {
  const ids: string[] = [];
  for (let n = 0; n < count; n++) {
    const workflowID = `${name}-${n}-${randomUUID()}`;
    await (await DBOS.startWorkflow(app.greet, { workflowID })(name)).getResult();
    ids.push(workflowID);
  }
  return ids;
}

async function statusOf(workflowId: string): Promise<string | undefined> {
  return (await DBOS.getWorkflowStatus(workflowId))?.status;
}

async function existing(ids: string[]): Promise<Set<string>> {
  return new Set((await DBOS.listWorkflows({ workflowIDs: ids })).map((w) => w.workflowID));
}

async function untilSuccess(workflowId: string): Promise<void> {
  await waitUntil(async () => (await statusOf(workflowId)) === 'SUCCESS', { what: `workflow ${workflowId} finishing` });
}

describe('the helpers', () => {
  test('isoAt is read back to the millisecond', () => {
    for (const epochMs of [0, 1, 999, 1000, 1001, Y2001, Y2001 - 1, 1_700_000_000_999, 2 ** 41]) {
      assert.equal(new Date(isoAt(epochMs)).getTime(), epochMs);
      assert.ok(isoAt(epochMs).endsWith('Z'));
    }
  });

  test('drain stops on a short batch, and on a batch that repeats the last', async () => {
    const acted: string[][] = [];
    const batches = [['a', 'b'], ['c', 'd'], ['e']];
    assert.equal(await drain(async () => batches.shift() ?? [], async (ids) => void acted.push(ids), 2), 5);
    assert.deepEqual(acted, [['a', 'b'], ['c', 'd'], ['e']]);
    let calls = 0;
    const stuck = await drain(async () => (calls++, ['x', 'y']), async () => undefined, 2);
    assert.deepEqual([stuck, calls], [2, 2]);
  });
});

describe('garbage collection', () => {
  test('the cutoff is strict to the millisecond', async () => {
    const cutoff = Y2001 + 1_000_000;
    const [at, beforeIt, afterIt, longBefore] = await workflows(4);
    made.push(at!, beforeIt!, afterIt!, longBefore!);
    for (const [workflowId, completed] of [[at, cutoff], [beforeIt, cutoff - 1], [afterIt, cutoff + 1], [longBefore, cutoff - 500_000]] as const) {
      env.setTimes(workflowId!, { created_at: cutoff - 600_000, completed_at: completed });
    }
    const pending = await env.startWaiter(); // not finished: never collected, however old
    env.setTimes(pending, { created_at: cutoff - 600_000 });
    made.push(pending);
    try {
      assert.deepEqual(await round({ gcCutoffEpochMs: cutoff }), { deleted: 2, cancelled: 0 });
      assert.deepEqual(await existing([at!, beforeIt!, afterIt!, longBefore!, pending]), new Set([at, afterIt, pending]));
      assert.equal(await DBOS.listWorkflowSteps(beforeIt!), undefined); // deleted with everything it held
    } finally {
      await env.release(pending);
      await untilSuccess(pending);
    }
  });

  for (const [count, batch, batches] of [
    [5, 2, [2, 2, 1]],
    [4, 2, [2, 2]],
    [3, 10, [3]],
    [3, null, [3]],
    [3, 0, [3]],
  ] as const) {
    test(`deletes run in batches: ${count} by ${batch}`, async (t) => {
      const cutoff = Y2001 + 2_000_000;
      const old = await workflows(count);
      const recent = await workflows(1, 'recent');
      made.push(...old, ...recent);
      old.forEach((workflowId, n) => env.setTimes(workflowId, { created_at: cutoff - 10_000 + n, completed_at: cutoff - 5_000 + n }));
      const seen: string[][] = [];
      const remove = DBOS.deleteWorkflows.bind(DBOS);
      t.mock.method(DBOS, 'deleteWorkflows', async (ids: string[], children?: boolean) => {
        seen.push([...ids]);
        await remove(ids, children);
      });
      assert.deepEqual(await round({ gcCutoffEpochMs: cutoff, gcBatchSize: batch }), { deleted: count, cancelled: 0 });
      assert.deepEqual(seen.map((ids) => ids.length), batches);
      assert.deepEqual(seen.flat(), old); // oldest first, each once
      assert.deepEqual(await existing([...old, ...recent]), new Set(recent));
    });
  }

  for (const [count, keep, batch] of [
    [5, 2, null],
    [7, 3, 2],
    [3, 5, null],
    [4, 4, 1],
  ] as const) {
    test(`the row threshold keeps exactly the newest finished: ${count} keep ${keep}`, async () => {
      // The threshold counts every finished workflow of the application: start from none.
      const finished = await DBOS.listWorkflows({ status: FINISHED, loadInput: false, loadOutput: false });
      if (finished.length > 0) await DBOS.deleteWorkflows(finished.map((w) => w.workflowID));
      const ids = await workflows(count);
      made.push(...ids);
      const future = 4_102_444_800_000; // 2100: newer than any other workflow a test has finished meanwhile
      [...ids].reverse().forEach((workflowId, n) => env.setTimes(workflowId, { created_at: future + n })); // ids[0] newest
      const pending = await env.startWaiter(); // not finished: neither counted nor deleted
      env.setTimes(pending, { created_at: future + count });
      made.push(pending);
      const others = (await DBOS.listWorkflows({ status: FINISHED })).length - count;
      try {
        const { deleted } = await round({ gcRowsThreshold: keep, gcBatchSize: batch });
        assert.equal(deleted, Math.max(0, count + others - keep));
        assert.deepEqual(await existing([...ids, pending]), new Set([...ids.slice(0, keep), pending]));
      } finally {
        await env.release(pending);
        await untilSuccess(pending);
      }
    });
  }

  for (const threshold of [0, -1]) {
    test(`a threshold of ${threshold} is no rule`, async () => {
      made.push(...(await workflows(2)));
      assert.deepEqual(await round({ gcRowsThreshold: threshold }), { deleted: 0, cancelled: 0 });
      assert.deepEqual(await existing(made), new Set(made));
    });
  }
});

describe('the global timeout', () => {
  test('cancels what was created at or before the cutoff', async () => {
    const cutoff = Y2001 + 4_000_000;
    const ids: Record<string, string> = {};
    for (const name of ['pending_at', 'pending_before', 'pending_after']) ids[name] = await env.startWaiter();
    for (const name of ['enqueued_at', 'enqueued_after', 'delayed_before']) {
      const workflowID = `${name}-${randomUUID()}`;
      const delayed = name.startsWith('delayed') ? { enqueueOptions: { delaySeconds: 3600 } } : {};
      await DBOS.startWorkflow(app.greet, { workflowID, queueName: app.PARKED_QUEUE, ...delayed })(name);
      ids[name] = workflowID;
    }
    ids['finished'] = (await workflows(1))[0]!;
    made.push(...Object.values(ids));
    const created: Record<string, number> = {
      pending_at: cutoff, pending_before: cutoff - 60_000, pending_after: cutoff + 1, enqueued_at: cutoff,
      enqueued_after: cutoff + 1, delayed_before: cutoff - 1, finished: cutoff - 1_000,
    };
    for (const [name, at] of Object.entries(created)) env.setTimes(ids[name]!, { created_at: at });
    const statuses = async () =>
      Object.fromEntries(await Promise.all(Object.entries(ids).map(async ([name, id]) => [name, await statusOf(id)])));
    const beforeRound = await statuses();
    assert.deepEqual(beforeRound, {
      pending_at: 'PENDING', pending_before: 'PENDING', pending_after: 'PENDING', enqueued_at: 'ENQUEUED',
      enqueued_after: 'ENQUEUED', delayed_before: 'DELAYED', finished: 'SUCCESS',
    });
    try {
      assert.deepEqual(await round({ gcBatchSize: 2, timeoutCutoffEpochMs: cutoff }), { deleted: 0, cancelled: 4 });
      assert.deepEqual(await statuses(), {
        ...beforeRound, pending_at: 'CANCELLED', pending_before: 'CANCELLED', enqueued_at: 'CANCELLED',
        delayed_before: 'CANCELLED',
      });
    } finally {
      await DBOS.cancelWorkflows([ids['enqueued_after']!]);
      for (const name of ['pending_at', 'pending_before', 'pending_after']) await env.release(ids[name]!);
      await untilSuccess(ids['pending_after']!);
    }
  });
});

describe('the retention request', () => {
  /** Stands in for `runRound`: records its inputs and waits for `release`. */
  function slowRound() {
    const calls: RoundInput[] = [];
    let release: () => void = () => undefined;
    let running: () => void = () => undefined;
    const released = new Promise<void>((resolve) => (release = resolve));
    const started = new Promise<void>((resolve) => (running = resolve));
    const fake: Round = async (input) => {
      calls.push(input);
      running();
      await released;
      return { deleted: 0, cancelled: 0 };
    };
    return { calls, release, started, fake };
  }

  test('answers at once, and a second one while a round runs is skipped', async () => {
    const slow = slowRound();
    const logger = new Lines();
    const asker = new Asker(env.table({ logger, round: slow.fake }));
    const body = { gc_cutoff_epoch_ms: Y2001, gc_rows_threshold: 1000, gc_batch_size: 50, timeout_cutoff_epoch_ms: null };
    try {
      assert.equal((await asker.ok('retention', { body }))['success'], true);
      await slow.started; // answered while the round runs
      assert.equal((await asker.ok('retention', { body: { ...body, gc_rows_threshold: 5 } }))['success'], true);
      assert.ok(logger.messages('warn').includes('Skipping retention: the previous round on this executor is still running.'));
      assert.deepEqual(slow.calls, [{ gcCutoffEpochMs: Y2001, gcRowsThreshold: 1000, gcBatchSize: 50, timeoutCutoffEpochMs: null }]);
    } finally {
      slow.release();
    }
    await waitUntil(() => !env.retentions.at(-1)!.running, { what: 'the round ending' });
    assert.equal((await asker.ok('retention', { body: { timeout_cutoff_epoch_ms: Y2001 } }))['success'], true); // the next one runs
    await waitUntil(() => slow.calls.length === 2, { what: 'the next round' });
    assert.deepEqual(slow.calls[1], { gcCutoffEpochMs: null, gcRowsThreshold: null, gcBatchSize: null, timeoutCutoffEpochMs: Y2001 });
  });

  test('a failed round is logged and the next one runs', async () => {
    const calls: (number | null)[] = [];
    const logger = new Lines();
    const failing: Round = async (input) => {
      calls.push(input.gcCutoffEpochMs);
      throw new Error('database gone');
    };
    const asker = new Asker(env.table({ logger, round: failing }));
    for (const cutoff of [1, 2]) {
      assert.equal((await asker.ok('retention', { body: { gc_cutoff_epoch_ms: cutoff } }))['success'], true);
      await waitUntil(() => !env.retentions.at(-1)!.running, { what: 'the round ending' });
    }
    assert.deepEqual(calls, [1, 2]);
    const failures = logger.messages('error').filter((m) => m.startsWith('Exception encountered during enforcing retention policy: Error: database gone'));
    assert.equal(failures.length, 2);
  });

  test('the request runs a real round', async () => {
    const cutoff = Y2001 + 5_000_000;
    const [old] = await workflows(1);
    const [recent] = await workflows(1, 'recent');
    made.push(old!, recent!);
    env.setTimes(old!, { created_at: cutoff - 2, completed_at: cutoff - 1 });
    const asker = new Asker(env.table());
    const body = { gc_cutoff_epoch_ms: cutoff, gc_rows_threshold: null, gc_batch_size: 10, timeout_cutoff_epoch_ms: null };
    assert.equal((await asker.ok('retention', { body }))['success'], true);
    await waitUntil(async () => (await DBOS.getWorkflowStatus(old!)) === null, { what: "the old workflow's deletion" });
    assert.deepEqual(await existing([old!, recent!]), new Set([recent]));
  });
});
