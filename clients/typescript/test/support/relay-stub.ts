/**
 * A `ws` server playing Relay: each connection gets `executor_info` first and its reply is kept; `onReady(socket, n)`
 * decides what happens next on the n-th connection (by default: wait for its close). `refuse` answers every upgrade
 * with that HTTP status instead. A frozen gateway is `socket.pause()`: the server stops reading, so the client's
 * pings go unanswered while the socket stays open, as with a gateway process that was stopped.
 */

import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import WebSocket, { WebSocketServer } from 'ws';

export type Frame = Record<string, unknown>;

/** Frames in arrival order, taken with a deadline. */
export class Inbox<T> {
  #items: T[] = [];
  #waiting: ((item: T) => void)[] = [];

  put(item: T): void {
    const waiter = this.#waiting.shift();
    if (waiter !== undefined) waiter(item);
    else this.#items.push(item);
  }

  get size(): number {
    return this.#items.length;
  }

  take(timeoutMs = 10_000): Promise<T> {
    const item = this.#items.shift();
    if (item !== undefined) return Promise.resolve(item);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#waiting = this.#waiting.filter((w) => w !== got);
        reject(new Error(`nothing arrived within ${timeoutMs} ms`));
      }, timeoutMs);
      const got = (value: T) => {
        clearTimeout(timer);
        resolve(value);
      };
      this.#waiting.push(got);
    });
  }
}

/** Sends `request` on `socket` and resolves with the reply carrying its request_id. */
export function request(socket: WebSocket, frame: Frame | string, timeoutMs = 10_000): Promise<Frame> {
  const text = typeof frame === 'string' ? frame : JSON.stringify(frame);
  const requestId = typeof frame === 'string' ? undefined : frame['request_id'];
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no reply to ${text.slice(0, 80)}`)), timeoutMs);
    const onMessage = (data: WebSocket.RawData) => {
      const bytes = Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data);
      const reply = JSON.parse(bytes.toString('utf8')) as Frame;
      if (requestId === undefined || reply['request_id'] === requestId) {
        clearTimeout(timer);
        socket.off('message', onMessage);
        resolve(reply);
      }
    };
    socket.on('message', onMessage);
    socket.send(text);
  });
}

export class RelayStub {
  readonly server: WebSocketServer;
  readonly requests: string[] = []; // the path of every upgrade request
  readonly replies = new Inbox<Frame>(); // each connection's executor_info reply
  readonly closes: [number, string][] = []; // the close code and reason each client sent
  readonly sockets: WebSocket[] = [];
  readonly pings: number[] = []; // when each client ping arrived (ms)
  connections = 0;
  onReady: (socket: WebSocket, n: number) => void = () => undefined;

  constructor(
    readonly refuse?: number,
    { autoPong = true }: { autoPong?: boolean } = {},
  ) {
    this.server = new WebSocketServer({
      host: '127.0.0.1',
      port: 0,
      autoPong, // false: a server that reads, and answers requests, but never a ping
      verifyClient: (info, done) => {
        this.requests.push(info.req.url ?? '');
        if (refuse === undefined) done(true);
        else done(false, refuse, 'no');
      },
    });
    this.server.on('connection', (socket) => this.#connected(socket));
  }

  get port(): number {
    return (this.server.address() as AddressInfo).port;
  }

  async listening(): Promise<this> {
    if (this.server.address() === null) {
      await new Promise((resolve) => this.server.once('listening', resolve));
    }
    return this;
  }

  #connected(socket: WebSocket): void {
    const n = ++this.connections;
    this.sockets.push(socket);
    socket.on('ping', () => this.pings.push(Date.now()));
    socket.on('close', (code, reason) => this.closes.push([code, reason.toString('utf8')]));
    const requestId = randomUUID();
    request(socket, { type: 'executor_info', request_id: requestId }).then(
      (reply) => {
        this.replies.put(reply);
        this.onReady(socket, n);
      },
      () => undefined, // the client went away first (the test is ending)
    );
  }

  async close(): Promise<void> {
    for (const socket of this.sockets) socket.terminate();
    await new Promise((resolve) => this.server.close(resolve));
  }
}
