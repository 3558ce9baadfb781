/**
 * The connection against a local `ws` server playing Relay (`support/relay-stub.ts`), on a real DBOS 5.3.0: it
 * answers the server's first request and every request type, reconnects when the socket is lost or stops answering
 * pings, backs off, closes cleanly, and never logs its key.
 */

import * as assert from 'node:assert/strict';
import { after, afterEach, before, describe, test } from 'node:test';
import { randomUUID } from 'node:crypto';
import { DBOS } from '@dbos-inc/dbos-sdk';
import type WebSocket from 'ws';
import { connect } from '../src/client';
import { Backoff, Connection, type ConnectionOptions } from '../src/connection';
import type { Logger } from '../src/log';
import * as app from './support/app';
import { DbosEnv, Lines } from './support/env';
import { freePort } from './support/postgres';
import { RelayStub, request } from './support/relay-stub';
import { waitUntil } from './support/wait';

const APP = app.APP_NAME;
const KEY = 'dbos_s3cr3t-key/with+odd chars';
const QUOTED_KEY = encodeURIComponent(KEY);

const env = new DbosEnv();
const stubs: RelayStub[] = [];
const made: Connection[] = [];

// Nothing the client does reaches the application as an unhandled rejection or an uncaught exception.
const escaped: unknown[] = [];
const onEscape = (err: unknown) => void escaped.push(err);
process.on('unhandledRejection', onEscape);
process.on('uncaughtException', onEscape);

before(() => env.start());
after(async () => {
  await env.stop();
  process.off('unhandledRejection', onEscape);
  process.off('uncaughtException', onEscape);
  assert.deepEqual(escaped, []);
});
afterEach(async () => {
  for (const connection of made.splice(0)) await connection.close(5_000);
  for (const stub of stubs.splice(0)) await stub.close();
});

/** A logger that keeps each line with the time it was logged. */
class TimedLines extends Lines implements Logger {
  readonly at: [number, string][] = [];
  override warn(message: string): void {
    this.at.push([Date.now(), message]);
    super.warn(message);
  }
}

async function stub(refuse?: number, options: { autoPong?: boolean } = {}): Promise<RelayStub> {
  const started = await new RelayStub(refuse, options).listening();
  stubs.push(started);
  return started;
}

/** A started connection on the real operations table, with short timeouts; closed at the test's end. */
function connection(port: number, options: Partial<ConnectionOptions> = {}): Connection {
  const logger = options.logger ?? new Lines();
  const started = new Connection({
    baseUrl: `ws://127.0.0.1:${port}/`,
    appName: APP,
    key: KEY,
    operations: env.table({ logger }),
    logger,
    closeTimeoutMs: 300,
    backoff: new Backoff({ initialMs: 50, capMs: 200, random: () => 0.5 }),
    ...options,
  });
  made.push(started);
  started.start();
  return started;
}

describe('the connection', () => {
  test('the server speaks first and gets executor_info', async () => {
    const relay = await stub();
    const opened = connection(relay.port);
    const reply = await relay.replies.take();
    assert.equal(reply['type'], 'executor_info');
    assert.equal(reply['executor_id'], DBOS.executorID);
    assert.equal(reply['language'], 'typescript');
    assert.equal(reply['error_message'], null);
    assert.deepEqual(relay.requests, [`/websocket/${APP}/${QUOTED_KEY}`]); // where every SDK connects
    assert.ok(await opened.waitConnected(5_000));
    assert.equal(opened.connections, 1);
  });

  test('every request type is answered on the socket, the 501s marked unsupported', async () => {
    const relay = await stub();
    let server: WebSocket | undefined;
    relay.onReady = (socket) => (server = socket);
    connection(relay.port);
    await relay.replies.take();
    await waitUntil(() => server, { what: 'the server socket' });
    const unsupported: string[] = [];
    const kinds = [...env.table().keys()];
    for (const kind of kinds) {
      const requestId = randomUUID();
      const reply = await request(server!, { type: kind, request_id: requestId });
      assert.deepEqual([reply['type'], reply['request_id']], [kind, requestId]);
      assert.ok('error_message' in reply, kind);
      if (reply['unsupported'] === true) unsupported.push(kind);
    }
    assert.equal(kinds.length, 33);
    assert.deepEqual(unsupported.sort(), [
      'export_workflow', 'get_metrics', 'get_step_aggregates', 'get_workflow_aggregates', 'get_workflow_events',
      'get_workflow_notifications', 'get_workflow_streams', 'import_workflow',
    ]);
    // A malformed frame and an unknown type are answered; the socket stays up and answers the next request.
    const bad = await request(server!, 'not json');
    assert.match(String(bad['error_message']), /^malformed message: not JSON/);
    const unknown = await request(server!, { type: 'no_such_type', request_id: 'u1' });
    assert.equal(unknown['error_message'], 'Unknown message type');
    const versions = await request(server!, { type: 'list_application_versions', request_id: 'v1' });
    assert.equal(versions['error_message'], null);
    assert.equal(relay.connections, 1);
  });

  test('a socket closed by the server is opened again', async () => {
    const relay = await stub();
    relay.onReady = (socket, n) => {
      if (n === 1) socket.close(1012, 'gateway restart');
    };
    const logger = new Lines();
    const opened = connection(relay.port, { logger });
    const first = await relay.replies.take();
    const second = await relay.replies.take();
    assert.notEqual(first['request_id'], second['request_id']); // a new executor_info on the new socket
    await waitUntil(() => opened.connections === 2, { what: 'the second connection' });
    assert.equal(relay.connections, 2);
    assert.ok(logger.messages('warn').includes('relay-dbos: connection to Relay lost (code 1012: gateway restart); reconnecting'));
    // Answered on the new socket: the next loss is retried after the first delay again.
    await waitUntil(() => opened.backoff.attempts === 0, { what: "the backoff's reset" });
  });

  test('a server that stops answering pings is dropped within the pong timeout', async () => {
    const relay = await stub();
    const logger = new TimedLines();
    const opened = connection(relay.port, { logger, pingIntervalMs: 200, pongTimeoutMs: 500 });
    await relay.replies.take();
    // While the server reads, the pongs come back and the socket stays: three pings take > the pong timeout.
    await waitUntil(() => relay.pings.length >= 3, { what: 'three pings answered' });
    assert.equal(opened.connections, 1);
    const frozenAt = Date.now();
    relay.sockets[0]!.pause(); // frozen: nothing more is read, so no pong goes out
    await relay.replies.take(); // the client came back, on a new socket
    const drops = logger.at.filter(([, m]) => m === 'relay-dbos: no pong from Relay within 0.5 s; reconnecting');
    assert.equal(drops.length, 1, String(logger.messages('warn')));
    const waited = drops[0]![0] - frozenAt;
    assert.ok(waited >= 300 && waited <= 1_500, String(waited)); // the next ping within 0.2 s, overdue 0.5 s later
    assert.equal(opened.connections, 2);
    assert.ok(await opened.waitConnected(5_000));
    assert.ok(logger.messages('info').includes(`relay-dbos: connected to Relay at ws://127.0.0.1:${relay.port}/websocket/${APP}/***`));
  });

  test('only a pong counts: requests flowing do not keep a socket whose pongs stopped', async () => {
    const relay = await stub(undefined, { autoPong: false });
    let server: WebSocket | undefined;
    relay.onReady = (socket, n) => {
      if (n === 1) server = socket;
    };
    const logger = new TimedLines();
    const opened = connection(relay.port, { logger, pingIntervalMs: 200, pongTimeoutMs: 500 });
    await relay.replies.take();
    await waitUntil(() => server, { what: 'the server socket' });
    const started = Date.now();
    let answered = 0;
    const asking = (async () => {
      while (server!.readyState === server!.OPEN && Date.now() - started < 5_000) {
        await request(server!, { type: 'list_application_versions', request_id: randomUUID() }, 2_000).then(
          () => (answered += 1),
          () => undefined,
        );
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    })();
    await relay.replies.take(); // the client came back on a new socket
    await asking;
    const drops = logger.at.filter(([, m]) => m === 'relay-dbos: no pong from Relay within 0.5 s; reconnecting');
    assert.ok(drops.length >= 1, String(logger.messages('warn'))); // the new socket goes the same way, later
    assert.ok(drops[0]![0] - started <= 1_500, String(drops[0]![0] - started));
    assert.ok(answered >= 3, String(answered)); // requests were answered all along
    assert.ok(opened.connections >= 2);
  });

  test('close ends the connection with a normal close', async () => {
    const relay = await stub();
    const opened = connection(relay.port, { pingIntervalMs: 50, pongTimeoutMs: 500 });
    await relay.replies.take();
    assert.ok(await opened.waitConnected(5_000));
    const started = Date.now();
    await opened.close(5_000);
    assert.ok(Date.now() - started < 2_000);
    assert.equal(opened.connected, false);
    await waitUntil(() => relay.closes.length > 0, { what: 'the server seeing the close' });
    assert.deepEqual(relay.closes, [[1000, '']]);
    await opened.close(); // idempotent
    await new Promise((resolve) => setTimeout(resolve, 300)); // a reconnect would be due by now
    assert.equal(relay.connections, 1);
  });

  test('close while waiting to reconnect', async () => {
    const port = await freePort();
    const opened = connection(port, { backoff: new Backoff({ initialMs: 20_000 }) });
    await waitUntil(() => opened.backoff.attempts >= 1, { what: 'a failed attempt' });
    const started = Date.now();
    await opened.close(5_000);
    assert.ok(Date.now() - started < 1_000); // not the 16-20 s backoff
  });

  test('reconnects back off: 1 s doubling to 30 s, jittered downwards', () => {
    for (const random of [() => 0, () => 0.5, () => 0.999]) {
      const backoff = new Backoff({ random });
      const delays = Array.from({ length: 40 }, () => backoff.nextMs());
      delays.forEach((delay, n) => {
        const step = Math.min(30_000, 1_000 * 2 ** n);
        assert.ok(delay >= 0.8 * step && delay <= step, `${n}: ${delay}`);
      });
    }
    const spread = new Set(Array.from({ length: 50 }, () => new Backoff().nextMs()));
    assert.ok(spread.size > 40 && Math.min(...spread) < 850 && Math.max(...spread) > 950);
    const backoff = new Backoff({ random: () => 0.5 });
    for (let n = 0; n < 10; n++) backoff.nextMs();
    backoff.reset();
    assert.equal(backoff.nextMs(), 900);
    assert.equal(new Backoff({ random: () => 0 }).nextMs(), 1_000);
    const far = new Backoff({ random: () => 0 });
    far.attempts = 10_000;
    assert.equal(far.nextMs(), 30_000);
  });

  test('refused connections are retried on the backoff schedule', async () => {
    const relay = await stub(403);
    const times: number[] = [];
    const original = relay.requests.push.bind(relay.requests);
    relay.requests.push = (...items: string[]) => (times.push(Date.now()), original(...items));
    connection(relay.port, { backoff: new Backoff({ initialMs: 100, capMs: 400, jitter: 0 }) });
    await waitUntil(() => times.length >= 5, { timeoutMs: 10_000, what: 'five attempts' });
    const gaps = times.slice(1).map((t, n) => t - times[n]!);
    // 100, 200, 400, 400 ms apart (plus the handshake's own time)
    [100, 200, 400, 400].forEach((wanted, n) => assert.ok(gaps[n]! >= wanted - 20 && gaps[n]! < wanted + 250, String(gaps)));
  });

  for (const kind of ['refused', 'bad port', 'not ws'] as const) {
    test(`the key is never logged: ${kind}`, async () => {
      const logger = new Lines();
      let opened: Connection;
      if (kind === 'refused') {
        const relay = await stub(403);
        opened = connection(relay.port, { logger });
        await waitUntil(() => relay.requests.length >= 3, { what: 'three refused attempts' });
      } else {
        opened = connection(0, { logger, baseUrl: kind === 'bad port' ? 'ws://127.0.0.1:99999/' : 'ftp://127.0.0.1:1/' });
        await waitUntil(() => opened.backoff.attempts >= 3, { what: 'three failed attempts' });
      }
      await opened.close();
      const texts = logger.messages();
      for (const text of texts) {
        assert.ok(!text.includes(KEY) && !text.includes(QUOTED_KEY) && !text.includes('s3cr3t'), text);
      }
      if (kind === 'refused') {
        assert.ok(texts.filter((t) => t.includes('Relay refused the connection') && t.includes('HTTP 403')).length >= 3);
        assert.ok(texts.some((t) => t.includes(`/websocket/${APP}/***`)));
      } else {
        assert.ok(texts.filter((t) => t.includes('cannot reach Relay')).length >= 3, String(texts));
      }
    });
  }
});

describe('connect()', () => {
  test('runs the client until close, with the URL and key from the environment', async () => {
    const relay = await stub();
    process.env['RELAY_URL'] = `ws://127.0.0.1:${relay.port}/`;
    process.env['RELAY_API_KEY'] = KEY;
    let relayHandle: Awaited<ReturnType<typeof connect>> | undefined;
    try {
      relayHandle = await connect({
        executorMetadata: { pod: 'orders-0' },
        pingIntervalMs: 200,
        pongTimeoutMs: 1_000,
        logger: new Lines(),
      });
      const reply = await relay.replies.take();
      assert.deepEqual(reply['executor_metadata'], { pod: 'orders-0' });
      assert.equal(reply['executor_id'], env.executorId);
      assert.deepEqual(relay.requests, [`/websocket/${APP}/${QUOTED_KEY}`]); // the app's name from the database
      assert.ok(await relayHandle.waitConnected(5_000));
      assert.ok(relayHandle.connected);
      await relayHandle.close();
      assert.equal(relayHandle.connected, false);
      await waitUntil(() => relay.closes.length === 1, { what: 'the normal close' });
      assert.deepEqual(relay.closes, [[1000, '']]);
    } finally {
      await relayHandle?.close();
      delete process.env['RELAY_URL'];
      delete process.env['RELAY_API_KEY'];
    }
  });

  test('takes the URL and the key as arguments too', async () => {
    const relay = await stub();
    delete process.env['RELAY_URL'];
    delete process.env['RELAY_API_KEY'];
    const relayHandle = await connect(`ws://127.0.0.1:${relay.port}/`, KEY, {
      appName: 'given-name',
      logger: new Lines(),
    });
    try {
      const reply = await relay.replies.take();
      assert.equal(reply['executor_id'], env.executorId);
      assert.equal(reply['executor_metadata'], null);
      assert.deepEqual(relay.requests, [`/websocket/given-name/${QUOTED_KEY}`]);
      assert.ok(await relayHandle.waitConnected(5_000));
    } finally {
      await relayHandle.close();
    }
  });

  test('needs a URL and a key', async () => {
    delete process.env['RELAY_URL'];
    delete process.env['RELAY_API_KEY'];
    await assert.rejects(connect({ key: KEY }), /no Relay URL/);
    await assert.rejects(connect({ url: 'ws://127.0.0.1:1/' }), /no API key/);
    await assert.rejects(connect(undefined, KEY), /no Relay URL/);
    await assert.rejects(connect('ws://127.0.0.1:1/'), /no API key/);
  });
});
