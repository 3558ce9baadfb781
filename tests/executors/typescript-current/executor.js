// A real DBOS TypeScript executor on the current SDK (@dbos-inc/dbos-sdk 5.3.0, whose conductor client is
// proprietary), connected through Relay's own client (relay-dbos, clients/typescript), for Relay's end-to-end tests:
// the twin of tests/executors/typescript/executor.js (5.2.11, conductorKey) and tests/executors/python/executor.py.
//
// Environment (tests/sdk.py): RELAY_URL, RELAY_KEY, APP_NAME, APP_VERSION, SYS_DB_URL (a PostgreSQL URL: the
// TypeScript SDK's system database is PostgreSQL only), STEP_LOG, STEP_SECONDS, EXECUTOR_METADATA, START_WORKFLOW /
// START_WORKFLOW_WHEN, FINISHED_WORKFLOWS, PENDING_WORKFLOWS, GATED_WORKFLOWS / GATE_DIR, QUEUED_WORKFLOWS,
// THREE_STEPS, SCHEDULE; and RELAY_PING_SECS / RELAY_PONG_TIMEOUT_SECS, the client's keepalive (20 s and 15 s unless
// set), EXECUTOR_ID (a fixed id; a new UUID per process unless set).
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const { DBOS } = require('@dbos-inc/dbos-sdk');
const relayDbos = require('relay-dbos');

const STEPS = 20;
const env = process.env;

DBOS.setConfig({
  name: env.APP_NAME,
  systemDatabaseUrl: env.SYS_DB_URL,
  applicationVersion: env.APP_VERSION || 'v1',
  executorID: relayDbos.executorId(env.EXECUTOR_ID || undefined),
  logLevel: env.LOG_LEVEL || 'info',
});

async function stepBody(i) {
  await new Promise((resolve) => setTimeout(resolve, 1000 * Number(env.STEP_SECONDS || '0.3')));
  fs.appendFileSync(env.STEP_LOG, `${process.pid} ${i}\n`);
  return i;
}
const step = DBOS.registerStep(stepBody, { name: 'step' });

const twentySteps = DBOS.registerWorkflow(
  async () => {
    let total = 0;
    for (let i = 0; i < STEPS; i++) {
      total += await step(i);
    }
    return total;
  },
  { name: 'twenty_steps' },
);

const finishes = DBOS.registerWorkflow(
  async () => {
    await DBOS.setEvent('answer', 42);
    return 'done';
  },
  { name: 'finishes' },
);
const waits = DBOS.registerWorkflow(async () => DBOS.sleep(3600 * 1000), { name: 'waits' });

const gateOpen = DBOS.registerStep(async (workflowId) => fs.existsSync(path.join(env.GATE_DIR, workflowId)), {
  name: 'gate_open',
});

// Polls its gate file (each look a checkpointed step): cancelled meanwhile it stays so; resumed, it goes on.
const gated = DBOS.registerWorkflow(
  async () => {
    while (!(await gateOpen(DBOS.workflowID))) {
      await DBOS.sleep(200);
    }
    return 'opened';
  },
  { name: 'gated' },
);

const loggedStep = DBOS.registerStep(
  async (i) => {
    fs.appendFileSync(env.STEP_LOG, `${process.pid} ${DBOS.workflowID} ${i}\n`);
    return i;
  },
  { name: 'logged_step' },
);

const threeSteps = DBOS.registerWorkflow(
  async () => {
    let total = 0;
    for (let i = 0; i < 3; i++) {
      total += await loggedStep(i);
    }
    return total;
  },
  { name: 'three_steps' },
);

const scheduled = DBOS.registerWorkflow(
  async (when, _context) => {
    DBOS.logger.info(`scheduled for ${when.toISOString()}`);
  },
  { name: 'scheduled' },
);

function ids(name) {
  return (env[name] || '').split(',').filter((id) => id);
}

function seconds(name, fallback) {
  return 1000 * Number(env[name] || fallback);
}

async function main() {
  await DBOS.launch();
  await relayDbos.connect(env.RELAY_URL, env.RELAY_KEY, {
    executorMetadata: env.EXECUTOR_METADATA ? JSON.parse(env.EXECUTOR_METADATA) : null,
    pingIntervalMs: seconds('RELAY_PING_SECS', 20),
    pongTimeoutMs: seconds('RELAY_PONG_TIMEOUT_SECS', 15),
  });
  for (const workflowID of ids('FINISHED_WORKFLOWS')) {
    await (await DBOS.startWorkflow(finishes, { workflowID })()).getResult();
  }
  for (const workflowID of ids('PENDING_WORKFLOWS')) {
    await DBOS.startWorkflow(waits, { workflowID })();
  }
  for (const workflowID of ids('GATED_WORKFLOWS')) {
    await DBOS.startWorkflow(gated, { workflowID })();
  }
  const queued = ids('QUEUED_WORKFLOWS');
  if (queued.length > 0) {
    await DBOS.registerQueue('serial', { globalConcurrency: 1 });
    for (const workflowID of queued) {
      await DBOS.startWorkflow(gated, { workflowID, queueName: 'serial' })();
    }
  }
  for (const workflowID of ids('THREE_STEPS')) {
    await (await DBOS.startWorkflow(threeSteps, { workflowID })()).getResult();
  }
  if (env.SCHEDULE) {
    await DBOS.createSchedule({ scheduleName: env.SCHEDULE, workflowFn: scheduled, schedule: '0 0 * * * *' });
  }
  const workflowID = env.START_WORKFLOW;
  if (workflowID) {
    while (!fs.existsSync(env.START_WORKFLOW_WHEN)) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    await DBOS.startWorkflow(twentySteps, { workflowID })();
  }
  // The socket to Relay keeps the process running until it is killed.
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
