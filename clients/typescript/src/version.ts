/**
 * The SDK release this client was built for, and the check that refuses any other: a release outside the range may
 * have moved or renamed a call this client makes (the one internal call above all), and would fail later, at a
 * worse moment. The check reads the installed `@dbos-inc/dbos-sdk`'s package.json, without loading the SDK.
 */

import * as fs from 'node:fs';
import * as path from 'node:path';

export const VERSION = '0.1.0';
export const SDK_PACKAGE = '@dbos-inc/dbos-sdk';
/** `~5.3`: 5.3.x releases, no pre-release or build. */
export const SUPPORTED: readonly [major: number, minor: number] = [5, 3];
export const SUPPORTED_TEXT = `${SDK_PACKAGE} ~5.3`;

/** Thrown at import when the installed SDK is not the release this client was built for. */
export class UnsupportedSdkError extends Error {}
// On the prototype, so the stack's first line (written when the error is made) names it too.
UnsupportedSdkError.prototype.name = 'UnsupportedSdkError';

function refusal(found: string | null): string {
  const installed = found === null ? `${SDK_PACKAGE} is not installed` : `${SDK_PACKAGE} ${found} is installed`;
  return `relay-dbos ${VERSION} supports ${SUPPORTED_TEXT}; ${installed}`;
}

/** Throws `UnsupportedSdkError`, one line, unless `found` (an SDK version; null: none installed) is a 5.3.x. */
export function checkDbosVersion(found: string | null): void {
  // A pre-release (5.3.0-rc.1) or a build (5.3.0+local) is refused too: its calls are not the release's.
  const match = found === null ? null : /^(\d+)\.(\d+)\.(\d+)$/.exec(found);
  if (match === null || Number(match[1]) !== SUPPORTED[0] || Number(match[2]) !== SUPPORTED[1]) {
    throw new UnsupportedSdkError(refusal(found));
  }
}

/** The installed SDK's version (null when it cannot be found), read from its package.json beside its entry point. */
export function installedDbosVersion(): string | null {
  let entry: string;
  try {
    entry = require.resolve(SDK_PACKAGE);
  } catch {
    return null;
  }
  // The package's "exports" hides its package.json from require(): walk up from the entry point instead.
  for (let dir = path.dirname(entry); dir !== path.dirname(dir); dir = path.dirname(dir)) {
    const file = path.join(dir, 'package.json');
    if (!fs.existsSync(file)) {
      continue;
    }
    const manifest = JSON.parse(fs.readFileSync(file, 'utf8')) as { name?: unknown; version?: unknown };
    if (manifest.name === SDK_PACKAGE) {
      return typeof manifest.version === 'string' ? manifest.version : null;
    }
  }
  return null;
}
