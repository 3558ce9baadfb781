/** The SDK version check: 5.3.x is accepted, anything else refused at import, in one line, before the SDK loads. */

import * as assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as path from 'node:path';
import { describe, test } from 'node:test';
import { checkDbosVersion, installedDbosVersion, UnsupportedSdkError, VERSION } from '../src/version';

const INDEX = path.join(__dirname, '..', 'src', 'index.js');

describe('checkDbosVersion', () => {
  for (const found of ['5.3.0', '5.3.1', '5.3.12']) {
    test(`accepts ${found}`, () => checkDbosVersion(found));
  }

  for (const found of ['5.2.11', '5.4.0', '6.3.0', '4.3.0', '5.3.0-rc.1', '5.3.0+local', '5.3', 'garbage', '', ' 5.3.0', '5.3.0\n']) {
    test(`refuses ${JSON.stringify(found)} in one line`, () => {
      assert.throws(
        () => checkDbosVersion(found),
        (err: Error) => {
          assert.ok(err instanceof UnsupportedSdkError);
          assert.equal(err.message, `relay-dbos ${VERSION} supports @dbos-inc/dbos-sdk ~5.3; @dbos-inc/dbos-sdk ${found} is installed`);
          if (!found.includes('\n')) assert.ok(!err.message.includes('\n'));
          return true;
        },
      );
    });
  }

  test('refuses a missing SDK', () => {
    assert.throws(() => checkDbosVersion(null), {
      message: `relay-dbos ${VERSION} supports @dbos-inc/dbos-sdk ~5.3; @dbos-inc/dbos-sdk is not installed`,
    });
  });

  test('reads the installed version', () => {
    assert.equal(installedDbosVersion(), '5.3.0');
  });
});

/** `require('relay-dbos')` (this checkout's build) in a child node, told that the installed SDK is `version` (null:
 * not installed); it prints whether the SDK's code was loaded. */
function importWith(version: string | null) {
  const script = `
    const fs = require('node:fs');
    const Module = require('node:module');
    const version = ${JSON.stringify(version)};
    const realRead = fs.readFileSync;
    fs.readFileSync = function (file, ...rest) {
      if (String(file).endsWith(['@dbos-inc', 'dbos-sdk', 'package.json'].join(require('node:path').sep))) {
        return JSON.stringify({ name: '@dbos-inc/dbos-sdk', version });
      }
      return realRead.call(this, file, ...rest);
    };
    if (version === null) {
      const realResolve = Module._resolveFilename;
      Module._resolveFilename = function (request, ...rest) {
        if (request === '@dbos-inc/dbos-sdk') throw Object.assign(new Error('not found'), { code: 'MODULE_NOT_FOUND' });
        return realResolve.call(this, request, ...rest);
      };
    }
    try {
      require(${JSON.stringify(INDEX)});
      console.log('imported');
    } finally {
      console.log(Object.keys(require.cache).some((f) => f.includes('dbos-sdk' + require('node:path').sep + 'dist')) ? 'sdk loaded' : 'sdk not loaded');
    }
  `;
  return spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 60_000 });
}

describe('the import', () => {
  for (const installed of ['5.2.11', '5.4.0']) {
    test(`is refused when the installed SDK is ${installed}`, () => {
      const child = importWith(installed);
      assert.equal(child.status, 1, child.stderr);
      assert.equal(child.stdout.trim(), 'sdk not loaded');
      const line = `UnsupportedSdkError: relay-dbos ${VERSION} supports @dbos-inc/dbos-sdk ~5.3; @dbos-inc/dbos-sdk ${installed} is installed`;
      assert.ok(child.stderr.split('\n').includes(line), child.stderr);
    });
  }

  test('is refused when the SDK is not installed', () => {
    const child = importWith(null);
    assert.equal(child.status, 1, child.stderr);
    const line = `UnsupportedSdkError: relay-dbos ${VERSION} supports @dbos-inc/dbos-sdk ~5.3; @dbos-inc/dbos-sdk is not installed`;
    assert.ok(child.stderr.split('\n').includes(line), child.stderr);
  });

  test('succeeds with a supported SDK (the control of the two above)', () => {
    const child = importWith('5.3.0');
    assert.equal(child.status, 0, child.stderr);
    assert.deepEqual(child.stdout.trim().split('\n'), ['imported', 'sdk loaded']);
  });
});
