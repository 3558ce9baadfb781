/** `executorId()`: one id per process, a fixed one as given. */

import * as assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as path from 'node:path';
import { test } from 'node:test';
import { executorId } from '../src/client';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

test('the same id twice in a process', () => {
  const first = executorId();
  assert.equal(executorId(), first);
  assert.match(first, UUID);
});

test('a fixed id is returned as given', () => {
  assert.equal(executorId('orders-0'), 'orders-0');
  assert.equal(executorId(' pod name '), ' pod name ');
  assert.notEqual(executorId(), 'orders-0'); // the process's own id is not replaced by a fixed one
});

test('an empty fixed id is refused', () => {
  for (const fixed of ['', ' ', '\t\n']) {
    assert.throws(() => executorId(fixed), /must not be empty/);
  }
});

test('another process draws another id', () => {
  const client = path.join(__dirname, '..', 'src', 'client.js');
  const script = `const { executorId } = require(${JSON.stringify(client)}); console.log(executorId(), executorId());`;
  const child = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 60_000 });
  assert.equal(child.status, 0, child.stderr);
  const [first, second] = child.stdout.trim().split(' ');
  assert.equal(first, second);
  assert.match(first!, UUID);
  assert.notEqual(first, executorId());
});
