/**
 * relay-dbos: connect a DBOS Transact (TypeScript) application to Relay, on the SDK's MIT-licensed public API.
 *
 * Use it instead of `conductorKey`:
 *
 *     DBOS.setConfig({ ..., executorID: executorId() });   // unique per process; a fixed one may be given
 *     await DBOS.launch();
 *     const relay = await connect('ws://relay:8090/', process.env.RELAY_API_KEY);   // RELAY_URL, RELAY_API_KEY if left out
 *     ...
 *     await DBOS.shutdown();
 *     await relay.close();
 *
 * It never loads `@dbos-inc/dbos-enterprise`, never sets a conductor key and does not touch the SDK's entitlement
 * code: it is an application-level client of Relay. The installed SDK must be a 5.3.x; any other is refused at
 * import, in one line, before the SDK is loaded.
 */

import { checkDbosVersion, installedDbosVersion } from './version';

checkDbosVersion(installedDbosVersion());

// Only once the version is known good: these load the SDK.
export { connect, executorId, Relay, type ConnectOptions } from './client';
export { Backoff } from './connection';
export type { Logger } from './log';
export type { AlertHandler } from './operations';
export { checkDbosVersion, SUPPORTED_TEXT, UnsupportedSdkError, VERSION } from './version';
