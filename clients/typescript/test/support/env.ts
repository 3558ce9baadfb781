/**
 * One real DBOS (the pinned 5.3.0) per test file, on a private PostgreSQL cluster, launched by the file's `before`
 * and shut down by its `after`; and the operations table built on it.
 */

import { randomUUID } from 'node:crypto';
import { DBOS } from '@dbos-inc/dbos-sdk';
import { executorId } from '../../src/client';
import type { Logger } from '../../src/log';
import { Operations, type AlertHandler } from '../../src/operations';
import type { Operation } from '../../src/protocol';
import { Retention, type Round } from '../../src/retention';
import { installedDbosVersion } from '../../src/version';
import * as app from './app';
import { PostgresCluster } from './postgres';

/** A logger that keeps its lines (and prints nothing). */
export class Lines implements Logger {
  readonly lines: { level: string; message: string }[] = [];
  debug(message: string): void {
    this.lines.push({ level: 'debug', message });
  }
  info(message: string): void {
    this.lines.push({ level: 'info', message });
  }
  warn(message: string): void {
    this.lines.push({ level: 'warn', message });
  }
  error(message: string): void {
    this.lines.push({ level: 'error', message });
  }
  messages(level?: string): string[] {
    return this.lines.filter((l) => level === undefined || l.level === level).map((l) => l.message);
  }
}

export class DbosEnv {
  readonly cluster = new PostgresCluster();
  readonly executorId = executorId();
  url = '';
  readonly waiters: [string, string][] = []; // (workflow id, topic)
  readonly retentions: Retention[] = [];

  async start(): Promise<void> {
    await this.cluster.start();
    this.url = this.cluster.createDatabase();
    await app.launch(this.url, this.executorId);
    await DBOS.registerQueue(app.WORK_QUEUE, { workerConcurrency: 4 });
    await DBOS.registerQueue(app.PARKED_QUEUE);
  }

  /** A workflow of this executor that stays PENDING until `release`. */
  async startWaiter(topic = 'go'): Promise<string> {
    const handle = await DBOS.startWorkflow(app.waiter, { workflowID: `waiter-${randomUUID()}` })(topic);
    this.waiters.push([handle.workflowID, topic]);
    return handle.workflowID;
  }

  async release(workflowId: string, topic = 'go'): Promise<void> {
    await DBOS.send(workflowId, 'released', topic);
  }

  /** Overwrite epoch-ms columns of one workflow's row, as an old workflow has them. */
  setTimes(workflowId: string, columns: Partial<Record<'created_at' | 'completed_at' | 'updated_at', number>>): void {
    const assignments = Object.entries(columns).map(([name, value]) => `${name} = ${Number(value)}`);
    const rows = this.cluster.sql(
      this.url,
      // A CTE, so that psql prints the count alone (an UPDATE's own output ends with its command tag).
      `WITH updated AS (UPDATE dbos.workflow_status SET ${assignments.join(', ')} ` +
        `WHERE workflow_uuid = '${workflowId.replace(/'/g, "''")}' RETURNING 1) SELECT count(*) FROM updated`,
    );
    if (rows.length !== 1 || rows[0]![0] !== '1') throw new Error(`no row for workflow ${workflowId}: ${JSON.stringify(rows)}`);
  }

  /** The operations table on this DBOS, as `connect()` builds it. */
  table({
    metadataOnly = false,
    metadata = null,
    onAlert = null,
    logger = new Lines(),
    round,
  }: {
    metadataOnly?: boolean;
    metadata?: Record<string, unknown> | null;
    onAlert?: AlertHandler | null;
    logger?: Logger;
    round?: Round;
  } = {}): Map<string, Operation> {
    const retention = new Retention(logger, round);
    this.retentions.push(retention);
    return new Operations({
      metadata,
      onAlert,
      metadataOnly,
      retention,
      logger,
      sdkVersion: installedDbosVersion() ?? 'unknown',
    }).table();
  }

  async stop(): Promise<void> {
    for (const retention of this.retentions) {
      await retention.join(10_000, { stop: true });
    }
    for (const [workflowId, topic] of this.waiters) {
      await this.release(workflowId, topic).catch(() => undefined); // a waiter holds DBOS until its message comes
    }
    await DBOS.shutdown({ workflowCompletionTimeoutMS: 5_000 }).catch(() => undefined);
    await this.cluster.stop();
  }
}
