/**
 * The conductor protocol as an executor speaks it, with no socket in it: a frame in, the reply frame out.
 *
 * Relay speaks first and the executor only answers: every request carries `type` and `request_id`, and its reply
 * carries the same two, the fields of that type, and `error_message` (null when all went well). The field names are
 * those of the conductor client built into @dbos-inc/dbos-sdk 5.2.11; the reply's shape (every field present, null
 * when empty) is that of Relay's Python client, `relay_dbos`.
 *
 * How a request can fail, and what the reply then says:
 *
 * - the frame is not a JSON object, or lacks `type` or `request_id`: an error reply with whatever could be read
 *   (Relay logs a reply it cannot match; nothing here throws);
 * - a required field is missing or of the wrong type: `error_message` names it (5.2.11 threw in its handler);
 * - the operation threw: `error_message` holds the context and the error's stack (only the error's name in
 *   metadata-only mode);
 * - the SDK release cannot do it (`Unsupported`): `error_message` says so and `unsupported` is true, which Relay
 *   answers with a 501 naming the operation, not a 502 that blames the executor;
 * - an unknown `type`: `"Unknown message type"`, as every SDK answers it.
 */

import type { Logger } from './log';

/** Requests that move an application's data rather than its metadata: refused in metadata-only mode, as the SDKs
 * refuse them (Relay answers the refusal with a 409). */
export const DATA_TYPES: ReadonlySet<string> = new Set([
  'get_workflow_events',
  'get_workflow_notifications',
  'get_workflow_streams',
  'export_workflow',
  'import_workflow',
]);
export const UNKNOWN_TYPE = 'Unknown message type';

/** A request this client cannot act on: a required field missing or of the wrong type. */
export class BadRequest extends Error {
  constructor(
    message: string,
    readonly kind = '',
    readonly requestId = '',
  ) {
    super(message);
  }
}

/** An operation this SDK release cannot do through its public API: the reply says so with `unsupported: true`. */
export class Unsupported extends Error {}
BadRequest.prototype.name = 'BadRequest';
Unsupported.prototype.name = 'Unsupported';

export type Fields = Record<string, unknown>;

/** What a field may be; `integer` is a JSON number without a fraction. */
export interface Kinds {
  string: string;
  integer: number;
  boolean: boolean;
  list: unknown[];
  object: Record<string, unknown>;
}
export type Kind = keyof Kinds;

const KIND_NAMES: Record<Kind, string> = {
  string: 'a string',
  integer: 'an integer',
  boolean: 'a boolean',
  list: 'a list',
  object: 'an object',
};

function isKind(value: unknown, kind: Kind): boolean {
  switch (kind) {
    case 'string':
      return typeof value === 'string';
    case 'integer':
      return typeof value === 'number' && Number.isSafeInteger(value);
    case 'boolean':
      return typeof value === 'boolean';
    case 'list':
      return Array.isArray(value);
    case 'object':
      return typeof value === 'object' && value !== null && !Array.isArray(value);
  }
}

/** What a JSON value is, as an error message names it. */
function described(value: unknown): string {
  if (Array.isArray(value)) return 'a list';
  if (typeof value === 'number') return Number.isInteger(value) ? 'an integer' : 'a number';
  if (typeof value === 'object') return 'an object';
  return KIND_NAMES[typeof value as Kind] ?? typeof value;
}

/** One request from Relay: its `type`, `request_id` and every other field as sent. */
export class Request {
  constructor(
    readonly kind: string,
    readonly requestId: string,
    readonly fields: Fields = {},
  ) {}

  /** An optional field: `undefined` when absent or null, `BadRequest` when of none of `kinds`. */
  get<K extends Kind>(name: string, ...kinds: K[]): Kinds[K] | undefined {
    const value = this.fields[name];
    if (value === undefined || value === null) {
      return undefined;
    }
    if (!kinds.some((kind) => isKind(value, kind))) {
      const expected = kinds.map((kind) => KIND_NAMES[kind]).join(' or ');
      throw new BadRequest(`${this.kind} request: field '${name}' must be ${expected}, not ${described(value)}`);
    }
    return value as Kinds[K];
  }

  require<K extends Kind>(name: string, ...kinds: K[]): Kinds[K] {
    const value = this.get(name, ...kinds);
    if (value === undefined) {
      throw new BadRequest(`${this.kind} request: field '${name}' is required`);
    }
    return value;
  }

  /** A list of strings, or `undefined` when absent or null. */
  strings(name: string): string[] | undefined {
    const value = this.get(name, 'list');
    if (value !== undefined && !value.every((item) => typeof item === 'string')) {
      throw new BadRequest(`${this.kind} request: field '${name}' must be a list of strings`);
    }
    return value as string[] | undefined;
  }

  /** A string or a list of strings (the list filters' shape), or `undefined`. */
  stringOrList(name: string): string | string[] | undefined {
    const value = this.get(name, 'string', 'list');
    return typeof value === 'string' ? value : this.strings(name);
  }

  /** The request's `body` object as a `Request` of the same type, so its fields are read the same way. */
  body({ required = true }: { required?: boolean } = {}): Request {
    const value = this.fields['body'];
    if ((value === undefined || value === null) && !required) {
      return new Request(this.kind, this.requestId, {});
    }
    if (!isKind(value, 'object')) {
      throw new BadRequest(`${this.kind} request: field 'body' must be an object`);
    }
    return new Request(this.kind, this.requestId, value as Fields);
  }
}

export type Handler = (request: Request) => Promise<Fields>;

/** How one request type is answered: `handler` returns the reply's fields; `failed` are the fields of a reply whose
 * request failed (`success: false`, an empty list, ...); `context` is what an error message says was being done. */
export interface Operation {
  readonly handler: Handler;
  readonly failed: Fields;
  readonly context: string;
}

/** The request in a frame; `BadRequest` (with whatever `type` and `request_id` could be read) when it is not one. */
export function decode(frame: string | Uint8Array): Request {
  let data: unknown;
  try {
    const text = typeof frame === 'string' ? frame : new TextDecoder('utf-8', { fatal: true }).decode(frame);
    data = JSON.parse(text);
  } catch (err) {
    throw new BadRequest(`malformed message: not JSON (${(err as Error).name})`);
  }
  if (!isKind(data, 'object')) {
    throw new BadRequest('malformed message: not a JSON object');
  }
  const fields = data as Fields;
  const kind = fields['type'];
  const requestId = fields['request_id'];
  if (typeof kind !== 'string' || typeof requestId !== 'string') {
    throw new BadRequest(
      "malformed message: 'type' and 'request_id' must be strings",
      typeof kind === 'string' ? kind : '',
      typeof requestId === 'string' ? requestId : '',
    );
  }
  return new Request(kind, requestId, fields);
}

/** A value JSON has no type for goes as text (a bigint); `undefined` becomes null, so every field is sent. */
function replacer(_key: string, value: unknown): unknown {
  if (typeof value === 'bigint') return value.toString();
  return value === undefined ? null : value;
}

export function encode(
  kind: string,
  requestId: string,
  fields: Fields,
  error: string | null = null,
  { unsupported = false }: { unsupported?: boolean } = {},
): string {
  const reply: Fields = { type: kind, request_id: requestId, ...fields, error_message: error };
  if (unsupported) {
    reply['unsupported'] = true;
  }
  return JSON.stringify(reply, replacer);
}

export interface HandleOptions {
  metadataOnly?: boolean;
  logger: Logger;
}

/** The reply to one frame. Never rejects: whatever went wrong is in the reply's `error_message`. */
export async function handle(
  frame: string | Uint8Array,
  operations: ReadonlyMap<string, Operation>,
  { metadataOnly = false, logger }: HandleOptions,
): Promise<string> {
  let request: Request;
  try {
    request = decode(frame);
  } catch (err) {
    const bad = err as BadRequest;
    logger.warn(`relay-dbos: ${bad.message}`);
    return encode(bad.kind, bad.requestId, {}, bad.message);
  }
  const operation = operations.get(request.kind);
  if (operation === undefined) {
    logger.warn(`relay-dbos: unexpected message type ${JSON.stringify(request.kind.slice(0, 40))}`);
    return encode(request.kind, request.requestId, {}, UNKNOWN_TYPE);
  }
  if (metadataOnly && DATA_TYPES.has(request.kind)) {
    return encode(
      request.kind,
      request.requestId,
      operation.failed,
      `${request.kind} is not allowed in conductor metadata-only mode`,
    );
  }
  try {
    return encode(request.kind, request.requestId, await operation.handler(request));
  } catch (err) {
    if (err instanceof BadRequest) {
      logger.warn(`relay-dbos: ${err.message}`);
      return encode(request.kind, request.requestId, operation.failed, err.message);
    }
    if (err instanceof Unsupported) {
      return encode(request.kind, request.requestId, operation.failed, err.message, { unsupported: true });
    }
    const detail = err instanceof Error ? (err.stack ?? `${err.name}: ${err.message}`) : String(err);
    logger.error(`relay-dbos: ${operation.context}: ${detail}`);
    const error = metadataOnly
      ? `${operation.context}: ${err instanceof Error ? err.name : typeof err} (details withheld in metadata-only mode)`
      : `${operation.context}: ${detail}`;
    return encode(request.kind, request.requestId, operation.failed, error);
  }
}
