/**
 * A private PostgreSQL cluster for the tests (the SDK's system database is PostgreSQL only), from Debian's
 * `postgresql` binaries: `initdb` into a temp dir, then the `postgres` binary itself (its PID is the server's) on a
 * free port, its unix socket in that dir, trust auth. PostgreSQL refuses to run as root: as root the cluster runs as
 * the `postgres` user the Debian package creates. `stop()` ends it by PID.
 */

import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { waitUntil } from './wait';

const SUPERUSER = 'relay';
// Durability is not under test: skip the fsyncs, for speed.
const SETTINGS = ['fsync=off', 'synchronous_commit=off', 'full_page_writes=off', 'listen_addresses=127.0.0.1'];

function pgBin(): string {
  const root = '/usr/lib/postgresql';
  const versions = fs.existsSync(root) ? fs.readdirSync(root).filter((v) => /^\d+$/.test(v)) : [];
  const found = versions
    .sort((a, b) => Number(a) - Number(b))
    .map((v) => path.join(root, v, 'bin'))
    .filter((bin) => fs.existsSync(path.join(bin, 'initdb')));
  if (found.length === 0) {
    throw new Error('PostgreSQL is missing: install the Debian package postgresql');
  }
  return found[found.length - 1]!;
}

/** A port nobody listens on now. */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

function serverUser(): { uid: number; gid: number } | undefined {
  if (process.getuid?.() !== 0) return undefined;
  const line = fs
    .readFileSync('/etc/passwd', 'utf8')
    .split('\n')
    .find((l) => l.startsWith('postgres:') || l.startsWith('nobody:'));
  if (line === undefined) throw new Error('running as root with no postgres or nobody user to run PostgreSQL as');
  const [, , uid, gid] = line.split(':');
  return { uid: Number(uid), gid: Number(gid) };
}

export class PostgresCluster {
  readonly bin = pgBin();
  readonly root = fs.mkdtempSync(path.join(os.tmpdir(), 'relay-dbos-ts-pg-'));
  readonly user = serverUser();
  port = 0;
  #server: ChildProcess | undefined;
  #databases = 0;

  async start(): Promise<void> {
    const data = path.join(this.root, 'data');
    const socketDir = path.join(this.root, 'sock');
    fs.mkdirSync(socketDir);
    if (this.user !== undefined) {
      fs.chownSync(this.root, this.user.uid, this.user.gid);
      fs.chownSync(socketDir, this.user.uid, this.user.gid);
    }
    const env = { PATH: `${this.bin}:/usr/bin:/bin`, LC_ALL: 'C', HOME: this.root };
    execFileSync(
      path.join(this.bin, 'initdb'),
      ['-D', data, '-U', SUPERUSER, '-A', 'trust', '-E', 'UTF8', '--locale=C', '--no-sync', '--no-instructions'],
      { env, stdio: 'pipe', ...this.user },
    );
    this.port = await freePort();
    const args = ['-D', data, '-p', String(this.port), '-k', socketDir, ...SETTINGS.flatMap((s) => ['-c', s])];
    const log = fs.openSync(path.join(this.root, 'postgres.log'), 'a');
    this.#server = spawn(path.join(this.bin, 'postgres'), args, { env, stdio: ['ignore', log, log], ...this.user });
    fs.closeSync(log);
    await waitUntil(() => this.#accepts(), { timeoutMs: 30_000, what: 'PostgreSQL accepting connections' });
  }

  #accepts(): boolean {
    if (this.#server?.exitCode !== null) {
      throw new Error(`postgres exited: ${fs.readFileSync(path.join(this.root, 'postgres.log'), 'utf8').slice(-3000)}`);
    }
    try {
      execFileSync(path.join(this.bin, 'pg_isready'), ['-q', '-h', '127.0.0.1', '-p', String(this.port)]);
      return true;
    } catch {
      return false;
    }
  }

  /** A new, empty database; its URL. */
  createDatabase(): string {
    const name = `dbos_${process.pid}_${++this.#databases}`;
    execFileSync(path.join(this.bin, 'createdb'), ['-h', '127.0.0.1', '-p', String(this.port), '-U', SUPERUSER, name]);
    return `postgresql://${SUPERUSER}@127.0.0.1:${this.port}/${name}`;
  }

  /** Run SQL against a database of this cluster (by URL); the rows, tab-separated. */
  sql(url: string, statement: string): string[][] {
    const out = execFileSync(path.join(this.bin, 'psql'), [url, '-v', 'ON_ERROR_STOP=1', '-At', '-F', '\t', '-c', statement], {
      encoding: 'utf8',
    });
    return out
      .split('\n')
      .filter((line) => line !== '')
      .map((line) => line.split('\t'));
  }

  /** Fast shutdown by PID (SIGINT), SIGKILL if it lingers; the data removed. */
  async stop(): Promise<void> {
    const server = this.#server;
    this.#server = undefined;
    if (server !== undefined && server.exitCode === null) {
      const exited = new Promise((resolve) => server.once('exit', resolve));
      server.kill('SIGINT');
      const timer = setTimeout(() => server.kill('SIGKILL'), 20_000);
      await exited;
      clearTimeout(timer);
    }
    fs.rmSync(this.root, { recursive: true, force: true });
  }
}
