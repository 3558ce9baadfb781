/** Requests through `protocol.handle` with a table of operations, as the connection sends them. */

import * as assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { handle, type Operation } from '../../src/protocol';
import { Lines } from './env';

// Replies are read field by field, as the JSON they are.
export type Reply = Record<string, any>;

export class Asker {
  constructor(
    readonly table: ReadonlyMap<string, Operation>,
    readonly metadataOnly = false,
    readonly logger = new Lines(),
  ) {}

  async raw(frame: string | Uint8Array): Promise<Reply> {
    const reply = JSON.parse(await handle(frame, this.table, { metadataOnly: this.metadataOnly, logger: this.logger }));
    assert.ok('error_message' in reply);
    return reply as Reply;
  }

  /** The reply to a request of type `kind`; its `type` and `request_id` are checked here. */
  async ask(kind: string, fields: Record<string, unknown> = {}): Promise<Reply> {
    const requestId = randomUUID();
    const reply = await this.raw(JSON.stringify({ type: kind, request_id: requestId, ...fields }));
    assert.equal(reply['type'], kind);
    assert.equal(reply['request_id'], requestId);
    return reply;
  }

  /** `ask`, and the reply must report no error. */
  async ok(kind: string, fields: Record<string, unknown> = {}): Promise<Reply> {
    const reply = await this.ask(kind, fields);
    assert.equal(reply['error_message'], null, String(reply['error_message']));
    return reply;
  }
}
