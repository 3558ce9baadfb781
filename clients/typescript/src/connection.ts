/**
 * The socket to Relay: connect, answer, keep alive, reconnect.
 *
 * Liveness is this client's own: a ping every `pingIntervalMs` (20 s) whose pong must come within `pongTimeoutMs`
 * (15 s), else the socket is dropped and another opened, through the load balancer, to whichever gateway is alive.
 * Only a pong counts (5.2.11 counted any message), so a gateway that was stopped while its sockets stay open is
 * left within the pong timeout. Relay's own pings are answered by `ws` as they arrive, whatever request is being
 * worked on.
 *
 * Requests are answered one at a time, in order, as Relay's Python client answers them; a retention round runs in
 * the background. A connection that fails to open, or is lost, is tried again after `Backoff`: 1 s, doubling to 30 s,
 * jittered, and back to 1 s once a connection has been answered on.
 *
 * The key is the last segment of the URL (the protocol puts it there); it is never logged: log lines name the URL
 * with the key replaced, and errors that quote the URL are rewritten the same way.
 */

import WebSocket from 'ws';
import { formatG, type Logger } from './log';
import { handle, type Operation } from './protocol';

export const PING_INTERVAL_MS = 20_000;
export const PONG_TIMEOUT_MS = 15_000;
export const OPEN_TIMEOUT_MS = 5_000; // the handshake, as 5.2.11 allows it
export const CLOSE_TIMEOUT_MS = 2_000; // a frozen gateway never answers the close: it is not waited for long

/** Delays between connection attempts: `initialMs` doubling to `capMs`, each drawn from the upper `1 - jitter` .. 1
 * of its step (never above `capMs`), so a fleet that lost its gateway together does not come back in one wave. */
export class Backoff {
  attempts = 0;
  readonly initialMs: number;
  readonly capMs: number;
  readonly jitter: number;
  readonly random: () => number;

  constructor({
    initialMs = 1_000,
    capMs = 30_000,
    jitter = 0.2,
    random = Math.random,
  }: { initialMs?: number; capMs?: number; jitter?: number; random?: () => number } = {}) {
    this.initialMs = initialMs;
    this.capMs = capMs;
    this.jitter = jitter;
    this.random = random;
  }

  nextMs(): number {
    const step = Math.min(this.capMs, this.initialMs * 2 ** Math.min(this.attempts, 30));
    this.attempts += 1;
    return step * (1 - this.jitter * this.random());
  }

  reset(): void {
    this.attempts = 0;
  }
}

/** `{base}/websocket/{app}/{key}`: where every SDK's conductor client connects. */
export function websocketUrl(base: string, appName: string, key: string): string {
  return `${base.replace(/\/+$/, '')}/websocket/${encodeURIComponent(appName)}/${encodeURIComponent(key)}`;
}

export interface ConnectionOptions {
  baseUrl: string;
  appName: string;
  key: string;
  operations: ReadonlyMap<string, Operation>;
  logger: Logger;
  metadataOnly?: boolean;
  pingIntervalMs?: number;
  pongTimeoutMs?: number;
  openTimeoutMs?: number;
  closeTimeoutMs?: number;
  backoff?: Backoff;
}

/** The connection, kept up until `close()`. `start` once. */
export class Connection {
  readonly url: string;
  readonly shownUrl: string;
  readonly backoff: Backoff;
  /** Sockets opened so far (a reconnect makes it 2). */
  connections = 0;
  #connected = false;
  #stopping = false;
  #socket: WebSocket | undefined;
  #reconnect: NodeJS.Timeout | undefined;
  #answering: Promise<void> = Promise.resolve(); // the requests of the current socket, one after the other
  #waiters: (() => void)[] = [];
  #closed: Promise<void> | undefined;
  readonly #options: Required<Omit<ConnectionOptions, 'backoff'>>;

  constructor(options: ConnectionOptions) {
    this.#options = {
      ...options,
      metadataOnly: options.metadataOnly ?? false,
      pingIntervalMs: options.pingIntervalMs ?? PING_INTERVAL_MS,
      pongTimeoutMs: options.pongTimeoutMs ?? PONG_TIMEOUT_MS,
      openTimeoutMs: options.openTimeoutMs ?? OPEN_TIMEOUT_MS,
      closeTimeoutMs: options.closeTimeoutMs ?? CLOSE_TIMEOUT_MS,
    };
    this.url = websocketUrl(options.baseUrl, options.appName, options.key);
    this.shownUrl = websocketUrl(options.baseUrl, options.appName, '') + '***'; // not quoted: it reads as a key
    this.backoff = options.backoff ?? new Backoff();
  }

  /** True while a socket is open and has been answered on. */
  get connected(): boolean {
    return this.#connected;
  }

  get stopping(): boolean {
    return this.#stopping;
  }

  start(): void {
    this.#open();
  }

  /** Resolves true once connected, false after `timeoutMs`. */
  waitConnected(timeoutMs: number): Promise<boolean> {
    if (this.#connected) return Promise.resolve(true);
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.#waiters = this.#waiters.filter((w) => w !== done);
        resolve(false);
      }, timeoutMs);
      const done = () => {
        clearTimeout(timer);
        resolve(true);
      };
      this.#waiters.push(done);
    });
  }

  /** Close the socket cleanly (a normal close, 1000) and stop reconnecting; idempotent. */
  close(timeoutMs = 5_000): Promise<void> {
    this.#closed ??= this.#close(timeoutMs);
    return this.#closed;
  }

  async #close(timeoutMs: number): Promise<void> {
    this.#stopping = true;
    clearTimeout(this.#reconnect);
    const socket = this.#socket;
    if (socket !== undefined) {
      await this.#shut(socket, 1000, '', Math.min(timeoutMs, this.#options.closeTimeoutMs));
    }
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.#answering, new Promise((resolve) => (timer = setTimeout(resolve, timeoutMs)))]);
    clearTimeout(timer);
    this.#options.logger.info('relay-dbos: connection to Relay closed');
  }

  /** Send a close frame and wait for the socket to end, at most `waitMs` (then it is cut). */
  #shut(socket: WebSocket, code: number, reason: string, waitMs: number): Promise<void> {
    if (socket.readyState === WebSocket.CLOSED) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(() => socket.terminate(), waitMs);
      socket.once('close', () => {
        clearTimeout(timer);
        resolve();
      });
      if (socket.readyState === WebSocket.CONNECTING) {
        socket.terminate();
      } else {
        socket.close(code, reason);
      }
    });
  }

  #redact(text: string): string {
    return text.split(this.url).join(this.shownUrl).split(this.#options.key).join('***');
  }

  #open(): void {
    if (this.#stopping) return;
    const { logger, openTimeoutMs } = this.#options;
    let socket: WebSocket;
    try {
      socket = new WebSocket(this.url, { handshakeTimeout: openTimeoutMs });
    } catch (err) {
      // An unusable URL throws here, before any socket: it is tried again like any failure (and logged each time).
      logger.warn(`relay-dbos: cannot reach Relay at ${this.shownUrl} (${this.#redact(String(err))}); reconnecting`);
      this.#scheduleReconnect();
      return;
    }
    this.#socket = socket;
    let failure: string | undefined;
    let opened = false;
    socket.on('open', () => {
      opened = true;
      this.connections += 1;
      this.#keepalive(socket);
    });
    socket.on('message', (data: WebSocket.RawData, isBinary: boolean) => {
      const frame = isBinary ? toBytes(data) : toBytes(data).toString('utf8');
      this.#answering = this.#answering
        .then(() => this.#answer(socket, frame))
        .catch((err: unknown) => logger.warn(`relay-dbos: cannot send a reply to Relay (${String(err)})`));
    });
    socket.on('error', (err: Error) => {
      const refused = /^Unexpected server response: (\d+)$/.exec(err.message);
      const detail = `${err.name}: ${this.#redact(err.message)}`;
      if (refused) {
        failure = `relay-dbos: Relay refused the connection to ${this.shownUrl}: HTTP ${refused[1]}`;
      } else if (opened) {
        failure = `relay-dbos: connection to Relay lost (${detail}); reconnecting`;
      } else {
        failure = `relay-dbos: cannot reach Relay at ${this.shownUrl} (${detail}); reconnecting`;
      }
    });
    socket.on('close', (code: number, reason: Buffer) => {
      const wasOpen = opened && failure === undefined;
      this.#setConnected(false);
      if (this.#socket === socket) this.#socket = undefined;
      if (this.#stopping) return;
      if (failure !== undefined) {
        logger.warn(failure);
      } else if (wasOpen) {
        const text = reason.length > 0 ? `code ${code}: ${reason.toString('utf8').slice(0, 100)}` : `code ${code}`;
        logger.warn(`relay-dbos: connection to Relay lost (${text}); reconnecting`);
      }
      this.#scheduleReconnect();
    });
  }

  async #answer(socket: WebSocket, frame: string | Buffer): Promise<void> {
    const reply = await handle(frame, this.#options.operations, {
      metadataOnly: this.#options.metadataOnly,
      logger: this.#options.logger,
    });
    if (socket.readyState !== WebSocket.OPEN) {
      return; // the socket went while the request was worked on: Relay asks again on the next one
    }
    await new Promise<void>((resolve) => socket.send(reply, () => resolve()));
    if (!this.#connected && socket === this.#socket) {
      this.#setConnected(true);
      this.backoff.reset();
      this.#options.logger.info(`relay-dbos: connected to Relay at ${this.shownUrl}`);
    }
  }

  #setConnected(connected: boolean): void {
    this.#connected = connected;
    if (connected) {
      const waiters = this.#waiters;
      this.#waiters = [];
      waiters.forEach((wake) => wake());
    }
  }

  #scheduleReconnect(): void {
    if (this.#stopping) return;
    clearTimeout(this.#reconnect);
    this.#reconnect = setTimeout(() => this.#open(), this.backoff.nextMs());
  }

  /** Ping every `pingIntervalMs`; a pong later than `pongTimeoutMs` drops the socket ('close' then reconnects).
   * Ends with its socket. */
  #keepalive(socket: WebSocket): void {
    const { pingIntervalMs, pongTimeoutMs, closeTimeoutMs, logger } = this.#options;
    let overdue: NodeJS.Timeout | undefined;
    const dropIfOpen = (): void => {
      if (this.#stopping || socket.readyState !== WebSocket.OPEN) return;
      logger.warn(`relay-dbos: no pong from Relay within ${formatG(pongTimeoutMs / 1000)} s; reconnecting`);
      void this.#shut(socket, 1011, 'pong timeout', closeTimeoutMs);
    };
    const ping = (): void => {
      if (socket.readyState !== WebSocket.OPEN) return;
      overdue = setTimeout(dropIfOpen, pongTimeoutMs);
      socket.ping();
    };
    let next = setTimeout(ping, pingIntervalMs);
    socket.on('pong', () => {
      clearTimeout(overdue);
      clearTimeout(next);
      next = setTimeout(ping, pingIntervalMs);
    });
    socket.once('close', () => {
      clearTimeout(overdue);
      clearTimeout(next);
    });
  }
}

function toBytes(data: WebSocket.RawData): Buffer {
  if (Buffer.isBuffer(data)) return data;
  if (Array.isArray(data)) return Buffer.concat(data);
  return Buffer.from(data);
}
