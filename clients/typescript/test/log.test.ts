/** The log helpers: `%g`-style seconds in the pong-timeout line, and a logger whose failures never escape. */

import * as assert from 'node:assert/strict';
import { test } from 'node:test';
import { formatG, safeLogger } from '../src/log';

test('formatG writes numbers as Python %g does', () => {
  const cases: [number, string][] = [
    [2, '2'], [15, '15'], [0.5, '0.5'], [2.5, '2.5'], [0.25, '0.25'], [1.5, '1.5'], [20, '20'], [0, '0'],
    [100000, '100000'], [1234567, '1.23457e+06'], [0.0001, '0.0001'], [0.00001, '1e-05'], [1 / 3, '0.333333'],
    [-2, '-2'], [999999.5, '1e+06'], [0.1 + 0.2, '0.3'],
  ];
  for (const [value, wanted] of cases) {
    assert.equal(formatG(value), wanted, String(value));
  }
});

test('safeLogger passes lines on and swallows a failing logger', () => {
  const lines: string[] = [];
  const passing = safeLogger({
    debug: (m) => lines.push(`debug ${m}`),
    info: (m) => lines.push(`info ${m}`),
    warn: (m) => lines.push(`warn ${m}`),
    error: (m) => lines.push(`error ${m}`),
  });
  passing.debug('a');
  passing.info('b');
  passing.warn('c');
  passing.error('d');
  assert.deepEqual(lines, ['debug a', 'info b', 'warn c', 'error d']);
  const broken = () => {
    throw new Error('the log is gone');
  };
  const failing = safeLogger({ debug: broken, info: broken, warn: broken, error: broken });
  assert.doesNotThrow(() => {
    failing.debug('a');
    failing.info('b');
    failing.warn('c');
    failing.error('d');
  });
});
