/**
 * The public interface: `executorId()` for DBOS's config, `connect()` once DBOS is launched, and the `Relay` handle
 * it returns.
 *
 * Identity: Relay recovers a dead executor by the id DBOS recorded as the owner of its workflows, so every process
 * needs an id of its own. `executorId()` gives each process a new UUID, and DBOS, run without a conductor, records
 * the id from its config (`DBOSConfig.executorID`, which wins over `DBOS__VMID`). A restarted process is therefore a
 * new executor: its predecessor's PENDING workflows come back through Relay's recovery by a peer. A fixed id (a
 * StatefulSet pod's name) may be given instead; then `DBOS.launch()` itself recovers that id's PENDING workflows of
 * the running version, and Relay sees the same executor come back.
 */

import { randomUUID } from 'node:crypto';
import { DBOS } from '@dbos-inc/dbos-sdk';
import { Backoff, Connection, PING_INTERVAL_MS, PONG_TIMEOUT_MS } from './connection';
import { dbosLogger, type Logger, safeLogger } from './log';
import { type AlertHandler, Operations } from './operations';
import { Retention } from './retention';
import { installedDbosVersion } from './version';

let processExecutorId: string | undefined; // drawn once: Node has no fork(), a process is its module state

/** This process's executor id for DBOS's config: `fixed` when given, else a UUID drawn once per process. */
export function executorId(fixed?: string): string {
  if (fixed !== undefined) {
    if (fixed.trim() === '') {
      throw new Error('relay-dbos executorId: a fixed executor id must not be empty');
    }
    return fixed;
  }
  processExecutorId ??= randomUUID();
  return processExecutorId;
}

/** The application's name as DBOS registered it: the owner of the running version (public
 * `listApplicationVersions`), for a `connect` that was not told it. */
async function registeredAppName(): Promise<string> {
  const running = DBOS.applicationVersion;
  for (const version of await DBOS.listApplicationVersions()) {
    if (version.versionName === running && version.applicationName) {
      return version.applicationName;
    }
  }
  throw new Error("relay-dbos connect: cannot tell the application's name; pass appName (the name in DBOS's config)");
}

/** A connection to Relay, kept up until `close()`. */
export class Relay {
  constructor(
    private readonly connection: Connection,
    private readonly retention: Retention,
  ) {}

  /** True while a socket to Relay is open and answering. */
  get connected(): boolean {
    return this.connection.connected;
  }

  waitConnected(timeoutMs = 10_000): Promise<boolean> {
    return this.connection.waitConnected(timeoutMs);
  }

  /** Close the socket cleanly and wait for a running retention round (at most `timeoutMs` each); idempotent.
   * Call it after `DBOS.shutdown()`: Relay takes a closed socket for a disconnect and, past the app's grace,
   * recovers the executor's PENDING workflows elsewhere, so the socket should outlive the workflows `shutdown` lets
   * finish. Until it is called the socket keeps Node's event loop alive, as any open connection does. */
  async close(timeoutMs = 5_000): Promise<void> {
    await this.connection.close(timeoutMs);
    await this.retention.join(timeoutMs, { stop: true });
  }
}

export interface ConnectOptions {
  /** Relay's base URL (`ws://relay:8090/`), else `RELAY_URL`. */
  url?: string;
  /** An API key of Relay's, else `RELAY_API_KEY`. Never logged. */
  key?: string;
  /** DBOS's `name` (read from the system database when left out). */
  appName?: string;
  /** Any JSON object, shown with the executor. */
  executorMetadata?: Record<string, unknown> | null;
  /** Takes the alerts Relay sends (logged when absent). */
  onAlert?: AlertHandler;
  /** Inputs, outputs and workflow data never leave the process. */
  metadataOnly?: boolean;
  pingIntervalMs?: number;
  pongTimeoutMs?: number;
  backoff?: Backoff;
  /** Where log lines go: DBOS's logger unless given. */
  logger?: Logger;
}

/**
 * Connect this launched DBOS application to Relay; the returned handle keeps the connection up until `close()`.
 * Resolves once the application's name is known, before Relay has answered (`waitConnected` tells when).
 *
 * `connect(url, key, options)` or `connect({url, key, ...options})`; a URL or key left out (or empty) is read from
 * `RELAY_URL` and `RELAY_API_KEY`.
 */
export async function connect(options?: ConnectOptions): Promise<Relay>;
export async function connect(url?: string, key?: string, options?: Omit<ConnectOptions, 'url' | 'key'>): Promise<Relay>;
export async function connect(
  first?: string | ConnectOptions,
  second?: string,
  third?: Omit<ConnectOptions, 'url' | 'key'>,
): Promise<Relay> {
  const options: ConnectOptions =
    typeof first === 'object' && first !== null ? first : { ...third, url: first, key: second };
  const url = options.url || process.env['RELAY_URL'];
  const key = options.key || process.env['RELAY_API_KEY'];
  if (!url) {
    throw new Error('relay-dbos connect: no Relay URL (pass url or set RELAY_URL)');
  }
  if (!key) {
    throw new Error('relay-dbos connect: no API key (pass key or set RELAY_API_KEY)');
  }
  if (!DBOS.isInitialized()) {
    // Also what a second copy of the SDK in node_modules looks like: this client's DBOS is not the app's.
    throw new Error('relay-dbos connect: DBOS is not launched (call connect() after DBOS.launch())');
  }
  const metadata = options.executorMetadata ?? null;
  if (metadata !== null) {
    JSON.stringify(metadata); // throws now, not at every executor_info, when it cannot be sent
  }
  const logger = safeLogger(options.logger ?? dbosLogger);
  const retention = new Retention(logger);
  const operations = new Operations({
    metadata,
    onAlert: options.onAlert ?? null,
    metadataOnly: options.metadataOnly ?? false,
    retention,
    logger,
    sdkVersion: installedDbosVersion() ?? 'unknown',
  });
  const connection = new Connection({
    baseUrl: url,
    appName: options.appName || (await registeredAppName()),
    key,
    operations: operations.table(),
    logger,
    metadataOnly: options.metadataOnly ?? false,
    pingIntervalMs: options.pingIntervalMs ?? PING_INTERVAL_MS,
    pongTimeoutMs: options.pongTimeoutMs ?? PONG_TIMEOUT_MS,
    backoff: options.backoff ?? new Backoff(),
  });
  connection.start();
  return new Relay(connection, retention);
}
