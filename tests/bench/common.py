"""What every benchmark shares: scale, processes started (and stopped) by PID with a raised file-descriptor
limit, /proc readings (RSS, CPU), the load generator's control channel, a Relay stack (embedded Temporal dev
server, `relay worker`, `relay gateway` as separate processes), the registry and audit log read from SQLite,
and the results table."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from tests.support import Process, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
PYTHON = sys.executable
RELAY = str(VENV_BIN / "relay")
EXECUTOR_APP = ROOT / "tests" / "executor_app.py"

SCALE = float(os.environ.get("BENCH_SCALE", "1"))
BENCH_DIR = Path(os.environ.get("BENCH_DIR", ROOT / ".relay-bench")).resolve()
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
ORG = "local"


def scaled(n: int, minimum: int = 10) -> int:
    return max(minimum, round(n * SCALE))


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- processes ---------------------------------------------------------------------------------------------


def raise_nofile() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit (10,000 sockets need more than the usual 1,024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


class Proc(Process):
    """A child process in its own session, output to a log file; stopped by its PID (``Process.stop``).

    Children inherit the orchestrator's raised RLIMIT_NOFILE (``raise_nofile`` runs first thing in ``main``):
    no ``preexec_fn``, which is unsafe once the orchestrator has threads (the Temporal client's).
    """

    def __init__(self, name: str, args: Sequence[str], *, env: Mapping[str, str], logdir: Path,
                 stdin: int | None = subprocess.DEVNULL, stdout: int | None = None) -> None:
        self.name = name
        self.log_path = self.log = logdir / f"{name}.log"
        with open(self.log_path, "ab") as out:
            self.popen = subprocess.Popen(
                list(args), env=dict(env), stdin=stdin, stdout=stdout if stdout is not None else out,
                stderr=out, cwd=ROOT, start_new_session=True,
            )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


def rss_bytes(pid: int) -> int:
    """Resident set size now (/proc/<pid>/statm, resident pages)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE


def hwm_bytes(pid: int) -> int:
    """Peak resident set size (VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (all its threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # After the command name: state is field 3, utime field 14, stime field 15 (1-based, man proc).
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def wait_quiet(pid: int, *, below: float = 0.05, window: float = 1.0, timeout: float = 60) -> float:
    """Wait until the process uses less than ``below`` of a core over ``window`` seconds; returns its last rate."""
    deadline = time.monotonic() + timeout
    rate = 1.0
    while time.monotonic() < deadline:
        start = cpu_seconds(pid)
        time.sleep(window)
        rate = (cpu_seconds(pid) - start) / window
        if rate < below:
            break
    return rate


def settled_rss(pid: int, *, samples: int = 5, interval: float = 1.0, below: float = 0.3) -> int:
    """RSS once the process is quiet (below ``below`` of a core): the median of a few readings."""
    wait_quiet(pid, below=below, timeout=30)
    readings = []
    for _ in range(samples):
        readings.append(rss_bytes(pid))
        time.sleep(interval)
    return int(statistics.median(readings))


# -- the load generator ------------------------------------------------------------------------------------


class Generator:
    """A `tests.bench.loadgen` process, driven by one JSON command per line on its stdin."""

    def __init__(self, name: str, logdir: Path) -> None:
        env = dict(os.environ)
        self.proc = Proc(name, [PYTHON, "-m", "tests.bench.loadgen"], env=env, logdir=logdir,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def call(self, cmd: str, **args: Any) -> dict[str, Any]:
        stdin, stdout = self.proc.popen.stdin, self.proc.popen.stdout
        assert stdin is not None and stdout is not None
        stdin.write((json.dumps({"cmd": cmd, **args}) + "\n").encode())
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"load generator exited: {self.proc.tail()}")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"load generator: {reply['error']}")
        return reply

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.call("quit")
        self.proc.stop(timeout=10)
        for pipe in (self.proc.popen.stdin, self.proc.popen.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):  # a generator that died leaves "quit" unflushed: BrokenPipeError
                    pipe.close()


# -- a Relay stack -----------------------------------------------------------------------------------------


def temporal_command(data_dir: Path, port: int) -> list[str]:
    """Relay's own embedded-server command line (search attributes, SQLite pragmas), with no web UI."""
    from cli.devserver import command
    from core.settings import Settings

    settings = Settings(data_dir=data_dir, temporal_port=port, temporal_ui_port=free_port())
    cmd = command(settings)
    i = cmd.index("--ui-port")
    del cmd[i:i + 2]
    return [*cmd, "--headless"]


def wait_temporal(target: str, timeout: float = 60) -> None:
    from temporalio.client import Client

    async def ping() -> bool:
        try:
            await Client.connect(target)
            return True
        except RuntimeError:
            return False

    wait_until(lambda: asyncio.run(ping()), timeout=timeout, interval=0.3, what=f"Temporal at {target}")


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Stack:
    """Embedded Temporal + `relay worker` + `relay gateway`, separate processes, one data dir."""

    name: str
    data_dir: Path
    env: dict[str, str]
    temporal: Proc
    worker: Proc
    gateway: Proc
    key: str
    url: str
    ws_url: str
    extra: list[Proc] = field(default_factory=list)

    @property
    def temporal_address(self) -> str:
        return self.env["RELAY_TEMPORAL_ADDRESS"]

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=30)

    def executor_url(self, app: str) -> str:
        return f"{self.ws_url}websocket/{app}/{self.key}"

    def put_app(self, app: str, **settings: Any) -> None:
        with self.api() as client:
            client.put(f"/v2/orgs/{ORG}/apps/{app}").raise_for_status()
            if settings:
                client.patch(f"/v2/orgs/{ORG}/apps/{app}", json=settings).raise_for_status()

    def rest_executors(self, app: str) -> dict[str, str]:
        with self.api() as client:
            response = client.get(f"/v2/orgs/{ORG}/apps/{app}/executors")
        response.raise_for_status()
        return {e["executorId"]: e["status"] for e in response.json()}

    @property
    def db_url(self) -> str | None:
        """Relay's database when it is not the SQLite file in the data dir (``RELAY_DATABASE_URL``)."""
        return self.env.get("RELAY_DATABASE_URL")

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of ``sql`` (``?`` placeholders) on Relay's database, read-only: the SQLite file in the data dir,
        or PostgreSQL when ``RELAY_DATABASE_URL`` names it."""
        if self.db_url is None:
            conn = sqlite3.connect(f"file:{self.data_dir / 'relay.db'}?mode=ro", uri=True, timeout=30)
            try:
                return [tuple(row) for row in conn.execute(sql, tuple(params))]
            finally:
                conn.close()
        import psycopg  # the postgres extra: only the PostgreSQL parts need it

        with psycopg.connect(pg_dsn(self.db_url), autocommit=True) as pg:
            return [tuple(row) for row in pg.execute(sql.replace("?", "%s"), tuple(params))]

    def _stamp(self, since: float) -> str | datetime:
        """``since`` (epoch seconds) as the database compares timestamps: SQLite stores them as UTC text."""
        moment = datetime.fromtimestamp(since, UTC)
        return moment if self.db_url is not None else moment.strftime("%Y-%m-%d %H:%M:%S.%f")

    def status_counts(self, app: str, *, since: float | None = None) -> dict[str, int]:
        """Registry rows of ``app`` by status (only rows updated at or after ``since``, epoch seconds)."""
        query = "SELECT status, COUNT(*) FROM executor WHERE org = ? AND app = ?"
        params: list[Any] = [ORG, app]
        if since is not None:
            query += " AND updated_at >= ?"
            params.append(self._stamp(since))
        return {str(status): int(n) for status, n in self.query(query + " GROUP BY status", params)}

    def audit(self, app: str, operations: Sequence[str], *, since: float | None = None
              ) -> list[tuple[str, str, float]]:
        """``(operation, executor_id, emit_time epoch)`` rows of ``app``."""
        marks = ",".join("?" * len(operations))
        query = (f"SELECT operation, executor_id, emit_time FROM auditlog WHERE org = ? AND app = ? "
                 f"AND operation IN ({marks})")
        params: list[Any] = [ORG, app, *operations]
        if since is not None:
            query += " AND emit_time >= ?"
            params.append(self._stamp(since))
        return [(op, ex, epoch(t)) for op, ex, t in self.query(query, params)]

    def audit_reasons(self, app: str, operation: str, *, since: float) -> Counter[str]:
        """The ``reason`` details of ``operation`` rows of ``app`` since ``since``, counted."""
        query = "SELECT details FROM auditlog WHERE org = ? AND app = ? AND operation = ? AND emit_time >= ?"
        rows = self.query(query, (ORG, app, operation, self._stamp(since)))
        # SQLite hands the JSON column back as text, PostgreSQL as a decoded object.
        details = [json.loads(d or "{}") if isinstance(d, str | None) else d for (d,) in rows]
        return Counter(str(d.get("reason", ""))[:160] for d in details)

    def wait_healthy(self, app: str, count: int, *, timeout: float, since: float | None = None,
                     interval: float = 0.1) -> float:
        """Wait until ``count`` rows of ``app`` are HEALTHY (updated since ``since``); returns the wall time."""
        deadline = time.monotonic() + timeout
        while True:
            healthy = self.status_counts(app, since=since).get("HEALTHY", 0)
            if healthy >= count:
                return time.time()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{healthy}/{count} executors of {app} HEALTHY after {timeout}s")
            time.sleep(interval)

    def count_workflows(self, app: str) -> int:
        """Lifecycle workflows of ``app`` that Temporal has started (the gateway's signal-with-start landed)."""
        from temporalio.client import Client

        async def count() -> int:
            client = await Client.connect(self.temporal_address)
            return (await client.count_workflows(f"RelayApp = '{app}'")).count

        return asyncio.run(count())

    def workflow_start_times(self, app: str) -> list[float]:
        from temporalio.client import Client

        async def starts() -> list[float]:
            client = await Client.connect(self.temporal_address)
            return [w.start_time.timestamp() async for w in client.list_workflows(f"RelayApp = '{app}'")]

        return asyncio.run(starts())

    def stop(self) -> None:
        for proc in [*self.extra, self.gateway, self.worker, self.temporal]:
            proc.stop()


def pg_dsn(url: str) -> str:
    """A SQLAlchemy PostgreSQL URL (``postgresql+psycopg://...``, as ``RELAY_DATABASE_URL`` takes) as libpq's."""
    return "postgresql://" + url.split("://", 1)[1]


def start_stack(name: str, *, gateway_cmd: Sequence[str] = (RELAY, "gateway"), temporal_args: Sequence[str] = (),
                **overrides: str) -> Stack:
    data_dir = BENCH_DIR / name
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    temporal_port, port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env.update({
        "RELAY_DATA_DIR": str(data_dir),
        "RELAY_PORT": str(port),
        "RELAY_TEMPORAL_ADDRESS": f"127.0.0.1:{temporal_port}",
        # One key for the whole fleet: lift the per-key admission caps (defaults: 10,000 sockets, 100
        # handshakes/s), which would otherwise throttle the storms by design rather than measure them.
        "RELAY_MAX_CONNECTIONS_PER_KEY": "1000000",
        "RELAY_HANDSHAKES_PER_KEY_PER_SECOND": "1000000",
        # No retention round in the middle of a measurement window.
        "RELAY_RETENTION_INTERVAL_SECS": "86400",
        # The worker and gateway processes of one stack would both take the default metrics ports.
        "RELAY_METRICS_PORT": "0",
        "RELAY_ALERT_INTERVAL_SECS": "86400",  # no alert round in a measurement window either
    })
    env.update(overrides)
    temporal = Proc("temporal", [*temporal_command(data_dir, temporal_port), *temporal_args], env=env, logdir=data_dir)
    procs = [temporal]
    try:
        wait_temporal(env["RELAY_TEMPORAL_ADDRESS"])
        key = subprocess.run([RELAY, "keys", "create", "--init", "--org", ORG, "--name", "bench"], env=env, cwd=ROOT,
                             check=True, capture_output=True, text=True).stdout.strip()
        worker = Proc("worker", [RELAY, "worker"], env=env, logdir=data_dir)
        procs.append(worker)
        gateway = Proc("gateway", gateway_cmd, env=env, logdir=data_dir)
        procs.append(gateway)
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _healthy(url), timeout=60, what="relay gateway /healthz")
    except BaseException:
        for proc in reversed(procs):
            proc.stop()
        raise
    return Stack(name, data_dir, env, temporal, worker, gateway, key, url, f"ws://127.0.0.1:{port}/")


def start_canary(stack: Stack, app: str = "canary") -> Proc:
    """One real `dbos==3.2.0` executor, alongside the fake fleet."""
    stack.put_app(app)
    env = {"PATH": str(VENV_BIN), "HOME": os.environ.get("HOME", "/tmp"), "RELAY_URL": stack.ws_url,
           "RELAY_KEY": stack.key, "APP_NAME": app, "SYS_DB": str(stack.data_dir / "canary-sys.sqlite"),
           "STEP_LOG": str(stack.data_dir / "canary-steps.log"), "APP_VERSION": "v1", "DBOS__VMID": "canary"}
    proc = Proc("canary", [PYTHON, str(EXECUTOR_APP)], env=env, logdir=stack.data_dir)
    stack.extra.append(proc)
    return proc


def canary_report(stack: Stack, app: str = "canary") -> dict[str, Any]:
    """The real executor's registry status and how often it was disconnected during the run."""
    statuses = stack.rest_executors(app)
    drops = len(stack.audit(app, ["executor.disconnected"]))
    return {"statuses": statuses, "disconnects": drops,
            "ok": bool(statuses) and set(statuses.values()) == {"HEALTHY"} and drops == 0}


# -- time and statistics -----------------------------------------------------------------------------------


def epoch(stored: str | datetime) -> float:
    """A timestamp column (UTC, stored by SQLite without its zone) as epoch seconds."""
    value = stored if isinstance(stored, datetime) else datetime.fromisoformat(stored)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


# -- results -----------------------------------------------------------------------------------------------


@dataclass
class Row:
    bench: str
    metric: str
    relay: float
    baseline: float | None
    unit: str
    target: str = ""  # e.g. "ratio <= 1.3", "relay <= 0.5"
    ratio: float | None = None
    met: bool | None = None
    note: str = ""


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def compare(self, bench: str, metric: str, relay: float, baseline: float, unit: str, *,
                max_ratio: float | None = None, min_ratio: float | None = None, note: str = "") -> Row:
        ratio = relay / baseline if baseline else float("inf")
        met: bool | None = None
        target = ""
        if max_ratio is not None:
            met, target = ratio <= max_ratio, f"ratio <= {max_ratio:g}"
        elif min_ratio is not None:
            met, target = ratio >= min_ratio, f"ratio >= {min_ratio:g}"
        row = Row(bench, metric, relay, baseline, unit, target, ratio, met, note)
        self.rows.append(row)
        return row

    def absolute(self, bench: str, metric: str, value: float, unit: str, *, at_most: float | None = None,
                 at_least: float | None = None, equals: float | None = None, note: str = "") -> Row:
        met: bool | None = None
        target = ""
        if at_most is not None:
            met, target = value <= at_most, f"<= {at_most:g} {unit}"
        elif at_least is not None:
            met, target = value >= at_least, f">= {at_least:g} {unit}"
        elif equals is not None:
            met, target = value == equals, f"== {equals:g}"
        row = Row(bench, metric, value, None, unit, target, None, met, note)
        self.rows.append(row)
        return row

    def table(self) -> str:
        header = ("bench", "metric", "relay", "baseline", "ratio", "target", "met")
        lines = [header]
        for r in self.rows:
            baseline = "" if r.baseline is None else _fmt(r.baseline, r.unit)
            lines.append((r.bench, r.metric, _fmt(r.relay, r.unit), baseline,
                          "" if r.ratio is None else f"{r.ratio:.2f}x", r.target,
                          "" if r.met is None else ("yes" if r.met else "NO")))
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        out = []
        for n, line in enumerate(lines):
            out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip())
            if n == 0:
                out.append("  ".join("-" * w for w in widths))
        notes = [f"  {r.bench} {r.metric}: {r.note}" for r in self.rows if r.note]
        return "\n".join(out + (["", "notes:", *notes] if notes else []))

    def as_json(self) -> dict[str, Any]:
        return {"rows": [r.__dict__ for r in self.rows], "details": self.details}


def _fmt(value: float, unit: str) -> str:
    if unit == "B":
        return f"{value:,.0f} B"
    if unit == "s":
        return f"{value:.3f} s"
    if unit == "us":
        return f"{value:,.1f} us"
    if unit == "/s":
        return f"{value:,.1f}/s"
    return f"{value:g} {unit}".strip()


def write_results(results: Results, started: float) -> Path:
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    path = BENCH_DIR / "results.json"
    payload = {"started": datetime.fromtimestamp(started, UTC).isoformat(), "scale": SCALE,
               "duration_s": round(time.time() - started, 1), "cpus": os.cpu_count(), **results.as_json()}
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path
