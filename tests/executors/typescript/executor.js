// A real DBOS TypeScript executor (@dbos-inc/dbos-sdk 5.2.11) for Relay's end-to-end tests, run as a subprocess:
// the TypeScript twin of tests/executor_app.py.
//
// Environment: RELAY_URL (the conductor URL), RELAY_KEY, APP_NAME, APP_VERSION, SYS_DB_URL (a PostgreSQL URL:
// the TypeScript SDK's system database is PostgreSQL only), STEP_LOG (a file each step appends "<pid> <step>"
// to), STEP_SECONDS, EXECUTOR_METADATA (a JSON object sent in executor_info), and START_WORKFLOW (a workflow id
// to start once the file START_WORKFLOW_WHEN exists). For retention tests: FINISHED_WORKFLOWS (comma-separated
// workflow ids run to completion at launch) and PENDING_WORKFLOWS (comma-separated ids started at launch that
// wait, PENDING, for an hour).
'use strict';

const fs = require('node:fs');
const { DBOS } = require('@dbos-inc/dbos-sdk');

const STEPS = 20;
const env = process.env;

DBOS.setConfig({
  name: env.APP_NAME,
  systemDatabaseUrl: env.SYS_DB_URL,
  applicationVersion: env.APP_VERSION || 'v1',
  logLevel: env.LOG_LEVEL || 'info',
});

async function stepBody(i) {
  await new Promise((resolve) => setTimeout(resolve, 1000 * Number(env.STEP_SECONDS || '0.3')));
  fs.appendFileSync(env.STEP_LOG, `${process.pid} ${i}\n`);
  return i;
}
const step = DBOS.registerStep(stepBody, { name: 'step' });

async function twentyStepsBody() {
  let total = 0;
  for (let i = 0; i < STEPS; i++) {
    total += await step(i);
  }
  return total;
}
const twentySteps = DBOS.registerWorkflow(twentyStepsBody, { name: 'twenty_steps' });

const finishes = DBOS.registerWorkflow(async () => 'done', { name: 'finishes' });
const waits = DBOS.registerWorkflow(async () => DBOS.sleep(3600 * 1000), { name: 'waits' });

function ids(name) {
  return (env[name] || '').split(',').filter((id) => id);
}

async function main() {
  await DBOS.launch({
    conductorURL: env.RELAY_URL,
    conductorKey: env.RELAY_KEY,
    conductorExecutorMetadata: env.EXECUTOR_METADATA ? JSON.parse(env.EXECUTOR_METADATA) : undefined,
  });
  for (const workflowID of ids('FINISHED_WORKFLOWS')) {
    await (await DBOS.startWorkflow(finishes, { workflowID })()).getResult();
  }
  for (const workflowID of ids('PENDING_WORKFLOWS')) {
    await DBOS.startWorkflow(waits, { workflowID })();
  }
  const workflowID = env.START_WORKFLOW;
  if (workflowID) {
    while (!fs.existsSync(env.START_WORKFLOW_WHEN)) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    await DBOS.startWorkflow(twentySteps, { workflowID })();
  }
  setInterval(() => {}, 1 << 30); // keep running until killed
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
