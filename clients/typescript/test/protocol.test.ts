/** Requests answered by `protocol.handle` with the real operations table, on a real DBOS 5.3.0 (`support/env.ts`). */

import * as assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import * as fs from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { DBOS, type WorkflowStatus } from '@dbos-inc/dbos-sdk';
import { UNKNOWN_TYPE } from '../src/protocol';
import { Asker, type Reply } from './support/ask';
import * as app from './support/app';
import { DbosEnv, Lines } from './support/env';
import { waitUntil } from './support/wait';

const ALL_TYPES = [
  'executor_info', 'recovery', 'exist_pending_workflows', 'retention', 'list_workflows', 'list_queued_workflows',
  'get_workflow', 'list_steps', 'cancel', 'resume', 'delete', 'fork_workflow', 'fork_from_failure',
  'rewind_workflow', 'get_metrics', 'alert', 'export_workflow', 'import_workflow', 'list_schedules',
  'get_schedule', 'pause_schedule', 'resume_schedule', 'backfill_schedule', 'trigger_schedule',
  'get_workflow_events', 'get_workflow_notifications', 'get_workflow_streams', 'get_workflow_aggregates',
  'get_step_aggregates', 'list_application_versions', 'set_latest_application_version', 'list_queues', 'get_queue',
].sort();
const UNSUPPORTED = [
  'get_metrics', 'export_workflow', 'import_workflow', 'get_workflow_events', 'get_workflow_notifications',
  'get_workflow_streams', 'get_workflow_aggregates', 'get_step_aggregates',
];
const WORKFLOW_FIELDS = [
  'WorkflowUUID', 'Status', 'WorkflowName', 'WorkflowClassName', 'WorkflowConfigName', 'AuthenticatedUser',
  'AssumedRole', 'AuthenticatedRoles', 'Input', 'Output', 'Error', 'CreatedAt', 'UpdatedAt', 'QueueName',
  'ApplicationVersion', 'ExecutorID', 'WorkflowTimeoutMS', 'WorkflowDeadlineEpochMS', 'DeduplicationID',
  'Priority', 'QueuePartitionKey', 'ForkedFrom', 'WasForkedFrom', 'ParentWorkflowID', 'DequeuedAt',
  'DelayUntilEpochMS', 'CompletedAt', 'Attributes', 'ScheduleName', 'ApplicationName',
].sort();
const ALL = { load_input: true, load_output: true };

const env = new DbosEnv();
let asker: Asker;
const alerts: [string, string, Record<string, string>][] = [];

before(async () => {
  await env.start();
  asker = new Asker(
    env.table({ metadata: { zone: 'test-a', rack: 7 }, onAlert: (...alert) => void alerts.push(alert) }),
  );
});
after(() => env.stop());

async function status(workflowId: string): Promise<WorkflowStatus> {
  const found = await DBOS.getWorkflowStatus(workflowId);
  assert.ok(found, `workflow ${workflowId} does not exist`);
  return found;
}

/** The workflow once it has `wanted` (polled: a resumed, forked or recovered one runs from a queue). */
function finished(workflowId: string, wanted = 'SUCCESS', timeoutMs = 15_000): Promise<WorkflowStatus> {
  return waitUntil(
    async () => {
      const found = await DBOS.getWorkflowStatus(workflowId);
      return found?.status === wanted ? found : null;
    },
    { timeoutMs, what: `workflow ${workflowId} reaching ${wanted}` },
  );
}

/** Runs a workflow to its end under a new id; the id. */
async function run<Args extends unknown[]>(workflow: (...args: Args) => Promise<unknown>, ...args: Args) {
  const workflowID = `wf-${randomUUID()}`;
  await (await DBOS.startWorkflow(workflow, { workflowID })(...args)).getResult().catch(() => undefined);
  return workflowID;
}

async function steps(workflowId: string) {
  return (await DBOS.listWorkflowSteps(workflowId)) ?? [];
}

/** The steps of `fork` copied from `original` (a workflow, or its steps as they were) rather than run again: those
 * with the same output and error (each execution of `token` and `broken` yields a new uuid). */
async function copiedSteps(original: string | Awaited<ReturnType<typeof steps>>, fork: string): Promise<number[]> {
  const key = (s: { output: unknown; error: unknown }) => `${String(s.output)}|${String(s.error)}`;
  const earlier = typeof original === 'string' ? await steps(original) : original;
  const keys = new Map(earlier.map((s) => [s.functionID, key(s)]));
  return (await steps(fork)).filter((s) => keys.get(s.functionID) === key(s)).map((s) => s.functionID);
}

describe('every request type', () => {
  test('the table answers the 33 request types', () => {
    assert.deepEqual([...asker.table.keys()].sort(), ALL_TYPES);
    assert.equal(asker.table.size, 33);
  });

  test('every type answers with its type, request_id and error_message', async () => {
    for (const kind of ALL_TYPES) {
      const reply = await asker.ask(kind); // no field but the two: answered, whether it can be acted on or not
      if (reply['error_message'] !== null) {
        assert.ok(typeof reply['error_message'] === 'string' && reply['error_message'].length > 0, kind);
        for (const [name, value] of Object.entries(asker.table.get(kind)!.failed)) {
          assert.deepEqual(reply[name], value, `${kind}.${name}`);
        }
      }
    }
  });
});

describe('the executor', () => {
  test('executor_info', async () => {
    const reply = await asker.ok('executor_info');
    assert.equal(reply['executor_id'], DBOS.executorID);
    assert.equal(reply['executor_id'], env.executorId);
    assert.equal(reply['application_version'], app.VERSION);
    assert.equal(reply['hostname'], hostname());
    assert.equal(reply['language'], 'typescript');
    assert.equal(reply['dbos_version'], '5.3.0');
    assert.deepEqual(reply['executor_metadata'], { zone: 'test-a', rack: 7 });
  });

  test('executor_info without metadata', async () => {
    assert.equal((await new Asker(env.table()).ok('executor_info'))['executor_metadata'], null);
  });
});

describe('workflows', () => {
  test('list_workflows replies in PascalCase with epoch-ms digits', async () => {
    const workflowId = await run(app.greet, 'world');
    const [listed] = (await asker.ok('list_workflows', { body: { workflow_uuids: [workflowId], ...ALL } }))['output'];
    assert.deepEqual(Object.keys(listed).sort(), WORKFLOW_FIELDS);
    const found = await status(workflowId);
    assert.equal(listed.WorkflowUUID, workflowId);
    assert.equal(listed.Status, 'SUCCESS');
    assert.equal(listed.WorkflowName, 'greet');
    assert.equal(listed.ExecutorID, env.executorId);
    assert.equal(listed.ApplicationVersion, app.VERSION);
    assert.equal(listed.ApplicationName, app.APP_NAME);
    assert.equal(listed.Input, "[ 'world' ]");
    assert.match(listed.Output, /^'hello world [0-9a-f-]{36}'$/);
    assert.equal(listed.Error, null);
    for (const name of ['CreatedAt', 'UpdatedAt', 'CompletedAt']) {
      assert.match(listed[name], /^\d+$/, name);
    }
    assert.equal(Number(listed.CreatedAt), found.createdAt);
    assert.equal(Number(listed.CompletedAt), found.completedAt);
    assert.equal(listed.WasForkedFrom, false);
    for (const [name, value] of Object.entries(listed)) {
      // the protocol's fields are text (or null), the one flag aside
      assert.ok(value === null || typeof value === 'string' || name === 'WasForkedFrom', name);
    }
  });

  test('a list carries inputs and outputs only when asked, as 5.2.11', async () => {
    const workflowId = await run(app.greet, 'quiet');
    const [listed] = (await asker.ok('list_workflows', { body: { workflow_uuids: [workflowId] } }))['output'];
    assert.equal(listed.Input, null);
    assert.equal(listed.Output, null);
  });

  test('list_workflows filters, sorts and pages', async () => {
    const prefix = `page-${randomUUID()}-`;
    const ids: string[] = [];
    for (let n = 0; n < 3; n++) {
      await (await DBOS.startWorkflow(app.greet, { workflowID: `${prefix}${n}` })(String(n))).getResult();
      ids.push(`${prefix}${n}`);
    }
    const ids_of = (reply: Reply) => (reply['output'] as Reply[]).map((w) => w['WorkflowUUID']);
    assert.deepEqual(ids_of(await asker.ok('list_workflows', { body: { workflow_id_prefix: prefix } })), ids);
    const newest = await asker.ok('list_workflows', { body: { workflow_id_prefix: prefix, sort_desc: true, limit: 2 } });
    assert.deepEqual(ids_of(newest), [ids[2], ids[1]]);
    const paged = await asker.ok('list_workflows', { body: { workflow_id_prefix: prefix, offset: 1, limit: 1 } });
    assert.deepEqual(ids_of(paged), [ids[1]]);
    assert.deepEqual(ids_of(await asker.ok('list_workflows', { body: { workflow_id_prefix: prefix, status: 'ERROR' } })), []);
  });

  test('get_workflow', async () => {
    const workflowId = await run(app.failing);
    const reply = await asker.ok('get_workflow', { workflow_id: workflowId });
    assert.equal(reply['output'].WorkflowUUID, workflowId);
    assert.equal(reply['output'].Status, 'ERROR');
    const error = JSON.parse(reply['output'].Error);
    assert.match(error.message, /^broken /);
    assert.equal(reply['output'].CreatedAt, String((await status(workflowId)).createdAt));
    assert.equal((await asker.ok('get_workflow', { workflow_id: `missing-${randomUUID()}` }))['output'], null);
  });

  test('list_queued_workflows and the queues', async () => {
    const workflowID = `parked-${randomUUID()}`;
    await DBOS.startWorkflow(app.greet, { workflowID, queueName: app.PARKED_QUEUE })('later');
    try {
      const listed = (await asker.ok('list_queued_workflows', { body: { queue_name: app.PARKED_QUEUE } }))['output'];
      assert.ok(listed.map((w: Reply) => w['WorkflowUUID']).includes(workflowID));
      assert.deepEqual([...new Set(listed.map((w: Reply) => w['Status']))], ['ENQUEUED']);
      const queues = new Map<string, Reply>(
        (await asker.ok('list_queues'))['output'].map((q: Reply) => [q['name'], q]),
      );
      assert.ok(queues.has(app.WORK_QUEUE) && queues.has(app.PARKED_QUEUE));
      assert.equal(queues.get(app.WORK_QUEUE)!['worker_concurrency'], 4);
      assert.equal(queues.get(app.WORK_QUEUE)!['priority_enabled'], true);
      assert.equal(queues.get(app.WORK_QUEUE)!['partition_queue'], false);
      assert.deepEqual((await asker.ok('get_queue', { name: app.WORK_QUEUE }))['output'], queues.get(app.WORK_QUEUE));
      assert.equal((await asker.ok('get_queue', { name: `missing-${randomUUID()}` }))['output'], null);
    } finally {
      await DBOS.cancelWorkflows([workflowID]);
    }
  });

  test('list_steps', async () => {
    const workflowId = await run(app.caughtFailure);
    const listed: Reply[] = (await asker.ok('list_steps', { workflow_id: workflowId }))['output'];
    assert.deepEqual(listed.map((s) => [s['function_id'], s['function_name']]), [[0, 'token'], [1, 'broken'], [2, 'token']]);
    assert.equal(listed[0]!['error'], null);
    assert.equal(listed[1]!['output'], null);
    assert.match(JSON.parse(listed[1]!['error']).message, /^broken /);
    assert.match(listed[0]!['output'], /^'[0-9a-f-]{36}'$/);
    for (const step of listed) {
      assert.match(step['started_at_epoch_ms'], /^\d+$/);
      assert.match(step['completed_at_epoch_ms'], /^\d+$/);
    }
    const page = (await asker.ok('list_steps', { workflow_id: workflowId, limit: 1, offset: 1 }))['output'];
    assert.deepEqual(page.map((s: Reply) => s['function_id']), [1]);
    const bare = (await asker.ok('list_steps', { workflow_id: workflowId, load_output: false }))['output'];
    assert.ok(bare.every((s: Reply) => s['output'] === null));
    assert.equal((await asker.ok('list_steps', { workflow_id: `missing-${randomUUID()}` }))['output'], null);
  });

  test('cancel, then resume', async () => {
    const first = await env.startWaiter();
    const second = await env.startWaiter();
    assert.equal((await status(first)).status, 'PENDING');
    assert.equal((await asker.ok('cancel', { workflow_id: first }))['success'], true);
    assert.equal((await status(first)).status, 'CANCELLED');
    assert.equal((await status(second)).status, 'PENDING');
    assert.equal((await asker.ok('cancel', { workflow_ids: [second] }))['success'], true);
    assert.equal((await status(second)).status, 'CANCELLED');
    for (const workflowId of [first, second]) {
      await env.release(workflowId); // the message the resumed execution will find
    }
    assert.equal((await asker.ok('resume', { workflow_ids: [first, second] }))['success'], true);
    assert.equal((await finished(first)).output, 'released');
    assert.equal((await finished(second)).output, 'released');
  });

  test('delete', async () => {
    const kept = await run(app.greet, 'a');
    const first = await run(app.greet, 'b');
    const second = await run(app.greet, 'c');
    assert.equal((await asker.ok('delete', { workflow_id: first }))['success'], true);
    assert.equal(await DBOS.getWorkflowStatus(first), null);
    assert.equal((await asker.ok('delete', { workflow_ids: [second] }))['success'], true);
    assert.equal(await DBOS.getWorkflowStatus(second), null);
    const left = await DBOS.listWorkflows({ workflowIDs: [first, second, kept] });
    assert.deepEqual(left.map((w) => w.workflowID), [kept]);
  });

  test('fork_workflow', async () => {
    const original = await run(app.caughtFailure);
    const newId = `fork-${randomUUID()}`;
    const reply = await asker.ok('fork_workflow', { body: { workflow_id: original, start_step: 1, new_workflow_id: newId } });
    assert.equal(reply['new_workflow_id'], newId);
    assert.equal((await finished(newId)).forkedFrom, original);
    assert.deepEqual(await copiedSteps(original, newId), [0]);
    assert.equal((await status(original)).wasForkedFrom, true);
    const listed = (await asker.ok('list_workflows', { body: { forked_from: original } }))['output'];
    assert.deepEqual(listed.map((w: Reply) => w['WorkflowUUID']), [newId]);
    // Without a new id, one is drawn.
    const drawn = (await asker.ok('fork_workflow', { body: { workflow_id: original, start_step: 0 } }))['new_workflow_id'];
    assert.match(drawn, /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
    await finished(drawn);
    assert.deepEqual(await copiedSteps(original, drawn), []);
  });

  // caught_failure's steps: 0 succeeds, 1 fails, 2 succeeds; a fork from step N copies the steps before N.
  for (const [mode, start] of [
    [{ from_last_failure: true }, 1],
    [{ from_last_step: true }, 2],
    [{ from_step: 0 }, 0],
    [{ from_step_name: 'token' }, 2],
  ] as const) {
    test(`fork_from_failure ${JSON.stringify(mode)}`, async () => {
      const original = await run(app.caughtFailure);
      const [fork] = (await asker.ok('fork_from_failure', { body: { workflow_ids: [original], ...mode } }))[
        'forked_workflow_ids'
      ];
      assert.equal((await finished(fork)).forkedFrom, original);
      assert.deepEqual(await copiedSteps(original, fork), [...Array(start).keys()]);
    });
  }

  test('fork_from_failure of failed workflows', async () => {
    const first = await run(app.failing);
    const second = await run(app.failing);
    assert.equal((await status(first)).status, 'ERROR');
    const reply = await asker.ok('fork_from_failure', { body: { workflow_ids: [first, second], from_last_failure: true } });
    const forks: string[] = reply['forked_workflow_ids'];
    assert.equal(forks.length, 2);
    for (const [n, original] of [first, second].entries()) {
      assert.equal((await finished(forks[n]!, 'ERROR')).forkedFrom, original); // step 1 fails again
      assert.deepEqual(await copiedSteps(original, forks[n]!), [0]);
    }
  });

  test('fork_from_failure needs exactly one mode', async () => {
    for (const modes of [{}, { from_last_failure: true, from_last_step: true }, { from_last_failure: false }]) {
      const reply = await asker.ask('fork_from_failure', { body: { workflow_ids: ['x'], ...modes } });
      assert.match(reply['error_message'], /exactly one of/);
      assert.equal(reply['forked_workflow_ids'], null);
    }
  });

  test('a failed operation replies with its stack', async () => {
    const missing = `missing-${randomUUID()}`;
    const reply = await asker.ask('fork_workflow', { body: { workflow_id: missing, start_step: 1 } });
    assert.equal(reply['new_workflow_id'], null);
    assert.ok(reply['error_message'].startsWith('Exception encountered when forking a workflow: '), reply['error_message']);
    assert.ok(reply['error_message'].includes(missing));
    assert.ok(reply['error_message'].includes('\n    at '), 'the stack');
  });

  test('rewind_workflow', async () => {
    const workflowId = await run(app.caughtFailure);
    const earlier = await steps(workflowId);
    assert.equal((await asker.ok('rewind_workflow', { body: { workflow_id: workflowId, start_step: 2 } }))['success'], true);
    await waitUntil(
      async () => {
        const now = await steps(workflowId);
        const done = (await status(workflowId)).status === 'SUCCESS' && now.length === 3;
        return done && now[2]!.output !== earlier[2]!.output;
      },
      { timeoutMs: 15_000, what: 'the rewound workflow running again' },
    );
    assert.deepEqual(await copiedSteps(earlier, workflowId), [0, 1]); // steps 0 and 1 kept, step 2 run again
  });
});

describe('recovery', () => {
  const children: ChildProcess[] = [];
  const directory = fs.mkdtempSync(path.join(tmpdir(), 'relay-dbos-ts-dead-'));

  /** A process of the same application that starts `count` waiters under `executorId`, then is SIGKILLed: its
   * workflows stay PENDING, owned by a dead executor. */
  async function deadExecutor(executorId: string, count: number): Promise<string[]> {
    const idsFile = path.join(directory, `${executorId}.ids`);
    const child = spawn(process.execPath, [path.join(__dirname, 'support', 'dead-executor.js'), env.url, executorId, String(count), idsFile], {
      stdio: ['pipe', 'ignore', 'pipe'],
    });
    children.push(child);
    let stderr = '';
    child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const ids = await waitUntil(
      () => {
        if (child.exitCode !== null) throw new Error(`the dead executor exited early: ${stderr.slice(-2000)}`);
        return fs.existsSync(idsFile) ? fs.readFileSync(idsFile, 'utf8').split('\n').filter(Boolean) : null;
      },
      { timeoutMs: 30_000, what: `${executorId} starting its workflows` },
    );
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGKILL');
    await exited;
    return ids;
  }

  after(async () => {
    for (const child of children) {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
    fs.rmSync(directory, { recursive: true, force: true });
  });

  test("recovery re-enqueues exactly the dead executors' pending workflows", async () => {
    const deadA = `dead-a-${randomUUID()}`;
    const deadB = `dead-b-${randomUUID()}`;
    const ofA = await deadExecutor(deadA, 2);
    const ofB = await deadExecutor(deadB, 1);
    const own = await env.startWaiter();
    for (const [workflowId, owner] of [...ofA.map((w) => [w, deadA]), ...ofB.map((w) => [w, deadB])] as const) {
      const found = await status(workflowId);
      assert.deepEqual([found.status, found.executorId, found.applicationVersion], ['PENDING', owner, app.VERSION]);
    }
    const pendingOf = (executorId: string) =>
      asker.ok('exist_pending_workflows', { executor_id: executorId, application_version: 'v1' });
    assert.equal((await pendingOf(deadA))['exist'], true);

    assert.equal((await asker.ok('recovery', { executor_ids: [deadA] }))['success'], true);

    assert.equal((await pendingOf(deadA))['exist'], false);
    for (const workflowId of ofA) {
      // back on a queue, then run here: the message lets them finish
      assert.ok(['ENQUEUED', 'PENDING'].includes((await status(workflowId)).status));
      await DBOS.send(workflowId, 'recovered', 'never');
    }
    for (const workflowId of ofA) {
      const done = await finished(workflowId);
      assert.deepEqual([done.output, done.executorId], ['recovered', env.executorId]);
    }
    // Another dead executor's workflows are not touched, nor this executor's.
    for (const [workflowId, owner] of [...ofB.map((w) => [w, deadB]), [own, env.executorId]] as const) {
      const found = await status(workflowId);
      assert.deepEqual([found.status, found.executorId, found.queueName], ['PENDING', owner, undefined]);
    }
    assert.equal((await pendingOf(deadB))['exist'], true);

    // A second request for the same id finds nothing and still succeeds.
    assert.equal((await asker.ok('recovery', { executor_ids: [deadA] }))['success'], true);
    for (const workflowId of ofA) assert.equal((await status(workflowId)).status, 'SUCCESS');

    // Both ids in one request: the one recovered already finds nothing, the other's workflows come back.
    assert.equal((await asker.ok('recovery', { executor_ids: [deadA, deadB] }))['success'], true);
    for (const workflowId of ofB) {
      await DBOS.send(workflowId, 'recovered', 'never');
      assert.equal((await finished(workflowId)).executorId, env.executorId);
    }
    await env.release(own);
    assert.equal((await finished(own)).output, 'released');
  });

  test('exist_pending_workflows', async () => {
    const pending = await env.startWaiter();
    try {
      const mine = { executor_id: env.executorId, application_version: app.VERSION };
      assert.equal((await asker.ok('exist_pending_workflows', mine))['exist'], true);
      assert.equal((await asker.ok('exist_pending_workflows', { ...mine, executor_id: 'another-id' }))['exist'], false);
      assert.equal((await asker.ok('exist_pending_workflows', { ...mine, application_version: 'v0' }))['exist'], false);
    } finally {
      await env.release(pending);
    }
    await finished(pending);
  });

  test('recovery needs a list of ids', async () => {
    for (const ids of [[5], 'dead', [null]]) {
      const reply = await asker.ask('recovery', { executor_ids: ids });
      assert.equal(reply['success'], false);
      assert.match(reply['error_message'], /executor_ids/);
    }
  });
});

describe('versions and schedules', () => {
  test('application versions', async () => {
    const versions: Reply[] = (await asker.ok('list_application_versions'))['output'];
    assert.ok(versions.map((v) => v['version_name']).includes(app.VERSION));
    assert.deepEqual(Object.keys(versions[0]!).sort(), ['created_at', 'version_id', 'version_name', 'version_timestamp']);
    assert.equal((await asker.ok('set_latest_application_version', { version_name: app.VERSION }))['success'], true);
    assert.equal((await DBOS.listApplicationVersions())[0]!.versionName, app.VERSION);
  });

  test('schedules when there are none', async () => {
    assert.deepEqual((await asker.ok('list_schedules', { body: { schedule_name_prefix: 'none-such-' } }))['output'], []);
    assert.equal((await asker.ok('get_schedule', { schedule_name: 'none-such' }))['output'], null);
  });

  test('schedules', async () => {
    const schedule = `nightly-${randomUUID()}`;
    await DBOS.createSchedule({ scheduleName: schedule, workflowFn: app.tick, schedule: '0 0 * * *', context: { region: 'eu' } });
    try {
      const [listed] = (await asker.ok('list_schedules', { body: { schedule_name_prefix: schedule } }))['output'];
      assert.equal(listed.schedule_name, schedule);
      assert.deepEqual([listed.workflow_name, listed.schedule, listed.status], ['tick', '0 0 * * *', 'ACTIVE']);
      assert.equal(listed.context, "{ region: 'eu' }");
      assert.deepEqual((await asker.ok('get_schedule', { schedule_name: schedule }))['output'], listed);
      assert.equal((await asker.ok('get_schedule', { schedule_name: schedule, load_context: false }))['output'].context, null);
      const quiet = new Asker(env.table({ metadataOnly: true }), true);
      assert.equal((await quiet.ok('get_schedule', { schedule_name: schedule }))['output'].context, null);

      assert.equal((await asker.ok('pause_schedule', { schedule_name: schedule }))['success'], true);
      assert.equal((await asker.ok('get_schedule', { schedule_name: schedule }))['output'].status, 'PAUSED');
      const active = await asker.ok('list_schedules', { body: { schedule_name_prefix: schedule, status: 'ACTIVE' } });
      assert.deepEqual(active['output'], []);
      assert.equal((await asker.ok('resume_schedule', { schedule_name: schedule }))['success'], true);
      assert.equal((await asker.ok('get_schedule', { schedule_name: schedule }))['output'].status, 'ACTIVE');

      const triggered = (await asker.ok('trigger_schedule', { schedule_name: schedule }))['workflow_id'];
      assert.equal((await finished(triggered)).workflowName, 'tick');
      const backfilled: string[] = (
        await asker.ok('backfill_schedule', {
          schedule_name: schedule,
          start: '2026-01-01T00:00:00+00:00',
          end: '2026-01-03T12:00:00+00:00',
        })
      )['workflow_ids'];
      const fired = await Promise.all(backfilled.map((w) => DBOS.getEvent<string>(w, 'scheduled_at', 15)));
      assert.ok(fired.length >= 2, String(fired));
      assert.ok(fired.includes('2026-01-02T00:00:00.000Z') && fired.includes('2026-01-03T00:00:00.000Z'), String(fired));
      const byName = await asker.ok('list_schedules', { body: { workflow_name: 'tick', schedule_name_prefix: schedule } });
      assert.deepEqual(byName['output'], [listed]);
    } finally {
      await DBOS.deleteSchedule(schedule);
    }
  });

  test('triggering a missing schedule fails', async () => {
    const reply = await asker.ask('trigger_schedule', { schedule_name: 'none-such' });
    assert.equal(reply['workflow_id'], null);
    assert.ok(reply['error_message'].startsWith('Exception encountered when triggering a schedule: '));
  });
});

describe('what 5.3 cannot do', () => {
  for (const kind of UNSUPPORTED) {
    test(`${kind} says so`, async () => {
      const reply = await asker.ask(kind, { workflow_id: 'w', body: {}, serialized_workflow: 'x' });
      assert.equal(reply['unsupported'], true);
      assert.ok(reply['error_message'].includes(kind));
      assert.ok(reply['error_message'].includes('@dbos-inc/dbos-sdk 5.3.0'));
      for (const [name, value] of Object.entries(asker.table.get(kind)!.failed)) {
        assert.deepEqual(reply[name], value);
      }
    });
  }
});

describe('alerts, unknown and malformed requests', () => {
  test('alert calls the handler', async () => {
    assert.equal((await asker.ok('alert', { name: 'disk', message: 'full', metadata: { host: 'a' } }))['success'], true);
    assert.equal((await asker.ok('alert', { name: 'cpu', message: 'hot' }))['success'], true);
    assert.deepEqual(alerts, [['disk', 'full', { host: 'a' }], ['cpu', 'hot', {}]]);
    const reply = await asker.ask('alert', { name: 'disk' });
    assert.equal(reply['success'], false);
    assert.match(reply['error_message'], /'message' is required/);
    assert.equal(alerts.length, 2);
  });

  test('an alert without a handler is logged', async () => {
    const logger = new Lines();
    assert.equal((await new Asker(env.table({ logger })).ok('alert', { name: 'disk', message: 'full' }))['success'], true);
    assert.ok(logger.messages('info').includes('Alert: disk | Message: full | Metadata: {}'), String(logger.messages()));
  });

  test('an unknown type', async () => {
    const reply = await asker.ask('no_such_type', { workflow_id: 'w' });
    assert.deepEqual(reply, { type: 'no_such_type', request_id: reply['request_id'], error_message: UNKNOWN_TYPE });
    assert.equal(UNKNOWN_TYPE, 'Unknown message type');
  });

  for (const [frame, kind, requestId, error] of [
    ['not json', '', '', 'not JSON'],
    [Uint8Array.from([0xff, 0xfe]), '', '', 'not JSON'],
    ['['.repeat(100_000), '', '', 'not JSON'],
    ['[{"type": "executor_info", "request_id": "r"}]', '', '', 'not a JSON object'],
    ['"executor_info"', '', '', 'not a JSON object'],
    ['null', '', '', 'not a JSON object'],
    ['{"type": "get_workflow", "workflow_id": "w"}', 'get_workflow', '', "'request_id' must be"],
    ['{"request_id": "r1"}', '', 'r1', "'type' and 'request_id' must be strings"],
    ['{"type": 5, "request_id": "r1"}', '', 'r1', 'must be strings'],
    ['{"type": "get_workflow", "request_id": 7}', 'get_workflow', '', 'must be strings'],
  ] as const) {
    test(`a malformed frame is answered, not thrown: ${String(frame).slice(0, 40)}`, async () => {
      const reply = await asker.raw(frame);
      assert.deepEqual([reply['type'], reply['request_id']], [kind, requestId]);
      assert.ok(reply['error_message'].startsWith('malformed message'));
      assert.ok(reply['error_message'].includes(error), reply['error_message']);
    });
  }

  for (const [kind, fields, error] of [
    ['get_workflow', {}, "field 'workflow_id' is required"],
    ['get_workflow', { workflow_id: null }, "field 'workflow_id' is required"],
    ['get_workflow', { workflow_id: 5 }, "field 'workflow_id' must be a string, not an integer"],
    ['get_workflow', { workflow_id: ['w'] }, "field 'workflow_id' must be a string, not a list"],
    ['list_workflows', {}, "field 'body' must be an object"],
    ['list_workflows', { body: [] }, "field 'body' must be an object"],
    ['list_workflows', { body: { limit: true } }, "field 'limit' must be an integer, not a boolean"],
    ['list_workflows', { body: { limit: '10' } }, "field 'limit' must be an integer, not a string"],
    ['list_workflows', { body: { limit: 1.5 } }, "field 'limit' must be an integer, not a number"],
    ['list_workflows', { body: { status: 3 } }, "field 'status' must be a string or a list, not an integer"],
    ['list_workflows', { body: { status: ['SUCCESS', 3] } }, "field 'status' must be a list of strings"],
    ['list_workflows', { body: { sort_desc: 'yes' } }, "field 'sort_desc' must be a boolean, not a string"],
    ['cancel', { workflow_ids: ['a', 2] }, "field 'workflow_ids' must be a list of strings"],
    ['cancel', { workflow_ids: 'a' }, "field 'workflow_ids' must be a list, not a string"],
    ['cancel', {}, "field 'workflow_id' is required"],
    ['fork_workflow', { body: { workflow_id: 'w' } }, "field 'start_step' is required"],
    ['fork_workflow', { body: { workflow_id: 'w', start_step: true } }, "'start_step' must be an integer"],
    ['retention', { body: { gc_cutoff_epoch_ms: '1' } }, "field 'gc_cutoff_epoch_ms' must be an integer"],
    ['alert', { name: 'n', message: 'm', metadata: [] }, "field 'metadata' must be an object"],
    ['fork_from_failure', { body: { workflow_ids: [1], from_step: 1 } }, 'must be a list of strings'],
    ['backfill_schedule', { schedule_name: 's', start: 'yesterday', end: 'now' }, "field 'start' is not a date"],
  ] as const) {
    test(`bad fields are answered with an error: ${kind} ${JSON.stringify(fields)}`, async () => {
      const reply = await asker.ask(kind, fields);
      assert.ok(reply['error_message'].includes(error), reply['error_message']);
      assert.ok(reply['error_message'].startsWith(`${kind} request`));
      for (const [name, value] of Object.entries(asker.table.get(kind)!.failed)) {
        assert.deepEqual(reply[name], value);
      }
    });
  }
});

describe('metadata-only mode', () => {
  test('data requests are refused; inputs, outputs and errors withheld', async () => {
    const quiet = new Asker(env.table({ metadataOnly: true }), true);
    const failed = await run(app.failing);
    const withEvent = await run(app.withEvent, 'secret', 'value');
    const reply = await quiet.ask('get_workflow_events', { workflow_id: withEvent });
    assert.match(reply['error_message'], /metadata-only/);
    assert.equal(reply['events'], null);
    assert.equal(reply['unsupported'], undefined); // refused (409), not unsupported (501)
    for (const kind of ['get_workflow_notifications', 'get_workflow_streams', 'export_workflow', 'import_workflow']) {
      assert.match((await quiet.ask(kind, { workflow_id: withEvent }))['error_message'], /metadata-only/);
    }
    const listed: Reply[] = (await quiet.ok('list_workflows', { body: { workflow_uuids: [failed, withEvent], ...ALL } }))['output'];
    assert.deepEqual(new Set(listed.map((w) => w['WorkflowUUID'])), new Set([failed, withEvent]));
    for (const workflow of listed) {
      assert.deepEqual([workflow['Input'], workflow['Output'], workflow['Error']], [null, null, null]);
      assert.match(workflow['CreatedAt'], /^\d+$/); // the metadata is there
    }
    const got = (await quiet.ok('get_workflow', { workflow_id: failed }))['output'];
    assert.deepEqual([got.Status, got.Input, got.Error], ['ERROR', null, null]);
    const listedSteps: Reply[] = (await quiet.ok('list_steps', { workflow_id: failed, load_output: true }))['output'];
    assert.deepEqual(
      listedSteps.map((s) => [s['function_name'], s['output'], s['error']]),
      [['token', null, null], ['broken', null, null]],
    );
  });

  test("a failure's details are withheld", async () => {
    const missing = `missing-${randomUUID()}`;
    const quiet = new Asker(env.table({ metadataOnly: true }), true);
    const reply = await quiet.ask('fork_workflow', { body: { workflow_id: missing, start_step: 1 } });
    assert.ok(reply['error_message'].startsWith('Exception encountered when forking a workflow: '));
    assert.ok(reply['error_message'].includes('details withheld in metadata-only mode'));
    assert.ok(!reply['error_message'].includes(missing) && !reply['error_message'].includes('    at '));
  });
});
