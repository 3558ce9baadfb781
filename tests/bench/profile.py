"""Where Relay's memory and CPU go, for when a benchmark misses its target (not part of `make bench`).

    python -m tests.bench.profile memory [N]            tracemalloc + gc object counts in the gateway, N sockets
    python -m tests.bench.profile cpu-heartbeat [N] [RATE] [SECONDS]
                                                        py-spy on the gateway while N sockets ping at RATE/s
    python -m tests.bench.profile cpu-storm [N]         py-spy on the gateway and the worker during a storm of N
    python -m tests.bench.profile cpu-burst [N] [K] [S] py-spy on the worker for S seconds (15) while K of N
                                                        executors close at once (grace 3 s): their deaths and
                                                        recoveries (P4 burst); S 2: their disconnects
    python -m tests.bench.profile bursts [N] [K] [R]    no profiler: R bursts of K of N executors, one stack, and
                                                        P4's lateness figures for each (to compare changes quickly),
                                                        where each step's time went (the histories), and each
                                                        process's CPU per death: close -> grace end, grace end ->
                                                        all DEAD, all DEAD -> all deleted

py-spy is not a dependency: install it anywhere (``pip install --target /tmp/pyspy py-spy``) and point
``PY_SPY`` at the binary, or have it on PATH. Reports go to stdout and ``.relay-bench/profile/``.
"""

from __future__ import annotations

import json
import linecache
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

from tests.bench.common import (
    BENCH_DIR,
    PYTHON,
    Generator,
    Stack,
    cpu_seconds,
    log,
    percentile,
    raise_nofile,
    settled_rss,
    start_stack,
)
from tests.support import wait_until

OUT = BENCH_DIR / "profile"
APP = "profile"


def _fleet(stack: Stack, gen: Generator, prefix: str, n: int, batch: int = 500) -> None:
    for first in range(0, n, batch):
        count = min(batch, n - first)
        reply = gen.call("connect", url=stack.executor_url(APP), prefix=prefix, start=first, count=count,
                         concurrency=100, timeout=300)
        assert reply["failed"] == 0, reply
        wait_until(lambda: stack.count_workflows(APP) >= first + count, timeout=600, interval=0.5,  # noqa: B023
                   what="workflows started")


# -- memory ------------------------------------------------------------------------------------------------


def _snapshot(stack: Stack, folder: Path) -> tuple[tracemalloc.Snapshot, dict[str, int]]:
    n = len(list(folder.glob("snapshot-*.pickle")))
    os.kill(stack.gateway.pid, signal.SIGUSR1)
    wait_until(lambda: (folder / f"snapshot-{n}.done").exists(), timeout=300, interval=0.5, what="snapshot")
    types: dict[str, int] = json.loads((folder / f"types-{n}.json").read_text())
    return tracemalloc.Snapshot.load(str(folder / f"snapshot-{n}.pickle")), types


def memory(n: int) -> None:
    folder = OUT / "memory"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    stack = start_stack("profile-memory", gateway_cmd=[PYTHON, "-m", "tests.bench.traced_gateway"],
                        BENCH_SNAPSHOT_DIR=str(folder))
    gen = Generator("loadgen-profile", stack.data_dir)
    try:
        stack.put_app(APP)
        _fleet(stack, gen, "warm-", 20)
        rss0 = settled_rss(stack.gateway.pid)
        snap0, types0 = _snapshot(stack, folder)
        _fleet(stack, gen, "mem-", n)
        time.sleep(3)
        rss1 = settled_rss(stack.gateway.pid)
        snap1, types1 = _snapshot(stack, folder)
    finally:
        gen.stop()
        stack.stop()
    report = [f"gateway RSS delta per connection: {(rss1 - rss0) / n:,.0f} B (tracemalloc on: it inflates RSS)"]
    by_line = snap1.compare_to(snap0, "lineno")
    traced = sum(s.size_diff for s in by_line)
    report.append(f"Python heap (tracemalloc) delta per connection: {traced / n:,.0f} B; the rest of the RSS "
                  "delta is outside the Python allocator (C/Rust libraries, malloc arenas, fragmentation)")
    report.append("\ntop allocation sites (per connection):")
    for stat in by_line[:30]:
        frame = stat.traceback[0]
        code = linecache.getline(frame.filename, frame.lineno).strip()[:70]
        report.append(f"  {stat.size_diff / n:8,.0f} B  {stat.count_diff / n:6.2f} blocks  "
                      f"{_short(frame.filename)}:{frame.lineno}  {code}")
    report.append("\nby the Relay frame nearest the allocation (gateway/, activities/, workflows/, worker.py):")
    relay: Counter[str] = Counter()
    for stat in snap1.compare_to(snap0, "traceback"):
        relay[_relay_frame(stat.traceback)] += stat.size_diff
    for where, size in relay.most_common(20):
        report.append(f"  {size / n:8,.0f} B  {where}")
    report.append("\ngc-tracked objects per connection, by type:")
    grown = Counter({k: v - types0.get(k, 0) for k, v in types1.items()})
    for name, count in grown.most_common(30):
        report.append(f"  {count / n:6.2f}  {name}")
    _emit(folder / "report.txt", report)


def _short(filename: str) -> str:
    for marker in ("site-packages/", "/work/main/", "lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def _relay_frame(traceback: tracemalloc.Traceback) -> str:
    """The Relay frame closest to the allocation (frames are stored oldest first)."""
    for frame in reversed(list(traceback)):
        path = _short(frame.filename)
        if path.startswith(("gateway/", "activities/", "workflows/", "worker.py")):
            return f"{path}:{frame.lineno}  {linecache.getline(frame.filename, frame.lineno).strip()[:60]}"
    site = traceback[-1]
    return f"(no Relay frame within the traced depth) {_short(site.filename)}:{site.lineno}"


# -- CPU ---------------------------------------------------------------------------------------------------


def _py_spy() -> str:
    found = os.environ.get("PY_SPY") or shutil.which("py-spy")
    if not found:
        sys.exit("py-spy not found: pip install --target /tmp/pyspy py-spy; PY_SPY=/tmp/pyspy/bin/py-spy")
    return found


def record(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    # PY_SPY_GIL=1: only the thread holding the GIL (the Python work, without the SDK's Rust threads and waits);
    # PY_SPY_RATE: samples per second (250).
    gil = ["--gil"] if os.environ.get("PY_SPY_GIL") else []
    rate = os.environ.get("PY_SPY_RATE", "250")
    return subprocess.Popen([_py_spy(), "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", rate,
                             *gil, "--format", "raw", "--output", str(out), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def summarize(raw: Path, title: str, top: int = 25) -> list[str]:
    inclusive: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    relay_inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = stack.split(";")
        total += count
        leaf[_frame(frames[-1])] += count
        for f in {_frame(f) for f in frames}:
            inclusive[f] += count
        for f in {_frame(f) for f in frames if _is_relay(f)}:
            relay_inclusive[f] += count
    lines = [f"\n{title}: {total} samples"]
    lines.append("  self time:")
    lines += [f"    {c / total:6.1%}  {f}" for f, c in leaf.most_common(top)]
    lines.append("  inclusive, Relay's own functions:")
    lines += [f"    {c / total:6.1%}  {f}" for f, c in relay_inclusive.most_common(top)]
    lines.append("  inclusive, any function:")
    lines += [f"    {c / total:6.1%}  {f}" for f, c in inclusive.most_common(top)]
    return lines


def _frame(frame: str) -> str:
    name, _, where = frame.partition(" (")
    return f"{name} ({_short(where.rstrip(')')).rsplit(':', 1)[0]})"


def _is_relay(frame: str) -> bool:
    return any(f"({d}" in frame or f"/{d}" in frame for d in ("gateway/", "activities/", "workflows/", "worker.py"))


def cpu_heartbeat(n: int, rate: float, seconds: float) -> None:
    folder = OUT / "cpu-heartbeat"
    folder.mkdir(parents=True, exist_ok=True)
    stack = start_stack("profile-cpu")
    gen = Generator("loadgen-profile", stack.data_dir)
    try:
        stack.put_app(APP)
        _fleet(stack, gen, "hb-", n)
        time.sleep(5)
        idle = record(stack.gateway.pid, seconds, folder / "idle.txt")
        idle.wait()
        gen.call("ping", prefix="hb-", start=0, count=n, rate=rate, duration=seconds + 2)
        time.sleep(1)
        busy = record(stack.gateway.pid, seconds, folder / "heartbeats.txt")
        busy.wait()
        gen.call("ping_result")
    finally:
        gen.stop()
        stack.stop()
    report = summarize(folder / "idle.txt", f"gateway, {n} idle sockets, {seconds:g} s")
    report += summarize(folder / "heartbeats.txt", f"gateway, {n} sockets pinging at {rate:g}/s, {seconds:g} s")
    _emit(folder / "report.txt", report)


def cpu_storm(n: int) -> None:
    folder = OUT / "cpu-storm"
    folder.mkdir(parents=True, exist_ok=True)
    stack = start_stack("profile-storm")
    gen = Generator("loadgen-profile", stack.data_dir)
    try:
        stack.put_app(APP)
        seconds = 30
        recorders = [record(stack.gateway.pid, seconds, folder / "gateway.txt"),
                     record(stack.worker.pid, seconds, folder / "worker.txt")]
        time.sleep(1)
        t0 = time.time()
        gen.call("connect", url=stack.executor_url(APP), prefix="storm-", count=n, concurrency=n, timeout=120)
        try:
            done = stack.wait_healthy(APP, n, timeout=seconds)
            log(f"{n} HEALTHY in {done - t0:.1f} s")
        except TimeoutError as err:
            log(str(err))
        for r in recorders:
            r.wait()
    finally:
        gen.stop()
        stack.stop()
    report = summarize(folder / "gateway.txt", f"gateway during a storm of {n}")
    report += summarize(folder / "worker.txt", f"worker during a storm of {n}")
    _emit(folder / "report.txt", report)


def cpu_burst(n: int, k: int, seconds: int = 15) -> None:
    folder = OUT / "cpu-burst"
    folder.mkdir(parents=True, exist_ok=True)
    stack = start_stack("profile-burst")
    gen = Generator("loadgen-profile", stack.data_dir)
    try:
        stack.put_app(APP, executorTimeoutSecs=3)
        gen.call("connect", url=stack.executor_url(APP), prefix="burst-", count=n, concurrency=100, timeout=300)
        stack.wait_healthy(APP, n, timeout=300)
        time.sleep(5)  # the connect storm's tail settled
        recorder = record(stack.worker.pid, seconds, folder / "worker.txt")
        time.sleep(0.5)
        gen.call("close", prefix="burst-", start=0, count=k, mode="close", spread=0.0)
        recorder.wait()
    finally:
        gen.stop()
        stack.stop()
    _emit(folder / "report.txt", summarize(folder / "worker.txt", f"worker while {k} of {n} die at once"))


def bursts(n: int, k: int, rounds: int) -> None:
    from tests.bench import bench_storm

    stack = start_stack("profile-bursts")
    gen = Generator("loadgen-profile", stack.data_dir)
    try:
        stack.put_app(bench_storm.P3_APP, executorTimeoutSecs=bench_storm.P4_GRACE)
        gen.call("connect", url=stack.executor_url(bench_storm.P3_APP), prefix="storm-", count=n, concurrency=100,
                 timeout=300)
        stack.wait_healthy(bench_storm.P3_APP, n, timeout=300)
        time.sleep(5)
        procs = {"gateway": stack.gateway.pid, "worker": stack.worker.pid, "temporal": stack.temporal.pid}
        for r in range(rounds):
            closed: dict[str, float] = {}
            with _CpuSampler(procs) as cpu:
                m = bench_storm._p4(stack, gen, r * k, k, 0.0, closed)
            _cpu_windows(stack, cpu, closed, bench_storm.P4_GRACE)
            log(f"burst {r + 1}: DISCONNECTED - close p50 {m['disconnected_p50_s']:.3f} p99 "
                f"{m['disconnected_p99_s']:.3f}; DEAD - DISCONNECTED - grace p50 {m['dead_p50_s']:.3f} "
                f"p99 {m['dead_p99_s']:.3f}; {m['recovered']} recovered, recovery p99 {m['recovery_p99_s']:.3f}")
            segments(stack, [f"storm-{i}" for i in range(r * k, (r + 1) * k)], closed)
            time.sleep(3)
    finally:
        gen.stop()
        stack.stop()


class _CpuSampler:
    """Each process's CPU seconds, every 0.1 s, for as long as the ``with`` block runs."""

    def __init__(self, procs: dict[str, int], every: float = 0.1) -> None:
        self.procs, self.every = procs, every
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append((time.time(), {name: cpu_seconds(pid) for name, pid in self.procs.items()}))
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> _CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, t: float) -> dict[str, float]:
        """The first sample at or after ``t`` (the last one if none)."""
        return next((cpu for at, cpu in self.samples if at >= t), self.samples[-1][1])


def _cpu_windows(stack: Stack, cpu: _CpuSampler, closed: dict[str, float], grace: float) -> None:
    """Milliseconds of CPU per death, per process, in a burst's three windows, cut at the audit log's times: the
    close to the first grace's end (the DISCONNECTED rows, the graces' timers, the fence's probes going out), the
    first grace's end to the last DEAD row, and the last DEAD row to the last deletion."""
    from tests.bench import bench_storm

    rows = stack.audit(bench_storm.P3_APP, ["executor.disconnected", "executor.dead", "executor.deleted"],
                       since=min(closed.values()) - 1)
    times: dict[str, list[float]] = {}
    for op, executor, t in rows:
        if executor in closed:
            times.setdefault(op, []).append(t)
    if len(times.get("executor.dead", [])) < len(closed) or not times.get("executor.deleted"):
        log("  CPU per death: not every executor DEAD and recovered; no windows")
        return
    cuts = [("close -> grace end", min(closed.values()), min(times["executor.disconnected"]) + grace),
            ("grace end -> all DEAD", min(times["executor.disconnected"]) + grace, max(times["executor.dead"])),
            ("all DEAD -> all deleted", max(times["executor.dead"]), max(times["executor.deleted"]))]
    for name, start, end in cuts:
        before, after = cpu.at(start), cpu.at(end)
        per = ", ".join(f"{p} {(after[p] - before[p]) / len(closed) * 1000:.1f}" for p in cpu.procs)
        log(f"  CPU ms per death, {name} ({end - start:.2f} s): {per}")


def segments(stack: Stack, executors: list[str], closed: dict[str, float], app: str = "") -> None:
    """Where the time from a close to the DISCONNECTED row, and from the grace's timer to the DEAD row, went, from
    the workflows' histories: the server's timestamps of each step (a step's p50 and p99 over the burst, in
    seconds)."""
    import asyncio
    from collections import defaultdict

    from temporalio.api.enums.v1 import EventType
    from temporalio.client import Client

    from tests.bench import bench_storm
    from workflows.contracts.common import lifecycle_workflow_id

    app = app or bench_storm.P3_APP

    async def histories() -> list[Any]:
        client = await Client.connect(stack.temporal_address)
        return [await client.get_workflow_handle(lifecycle_workflow_id("local", app, e)).fetch_history()
                for e in executors]

    spans: dict[str, list[float]] = defaultdict(list)
    timed_out = 0
    audit = {(op, ex): t for op, ex, t in stack.audit(app, ["executor.disconnected", "executor.dead"])
             if ex in executors}
    for executor, history in zip(executors, asyncio.run(histories()), strict=True):
        events = history.events
        signalled = next((e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
                          and e.workflow_execution_signaled_event_attributes.signal_name == "disconnected"), None)
        if signalled is not None and ("executor.disconnected", executor) in audit and executor in closed:
            at = signalled.event_time.ToDatetime().timestamp()
            after = [e for e in events if e.event_id > signalled.event_id]
            t_sched = next((e.event_time.ToDatetime().timestamp() for e in after
                            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED), at)
            t_start = next((e.event_time.ToDatetime().timestamp() for e in after
                            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED), t_sched)
            spans["d1. close -> signal in history"].append(at - closed[executor])
            spans["d2. signal -> its workflow task scheduled"].append(t_sched - at)
            spans["d3. workflow task scheduled -> started"].append(t_start - t_sched)
            spans["d4. workflow task started -> DISCONNECTED row"].append(
                audit["executor.disconnected", executor] - t_start)
        started = next((e for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED), None)
        fired_at = next((e for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_FIRED), None)
        if started and fired_at and ("executor.dead", executor) in audit:
            t_started = started.event_time.ToDatetime().timestamp()
            t_fired = fired_at.event_time.ToDatetime().timestamp()
            spans["0a. DISCONNECTED row -> timer started"].append(t_started - audit["executor.disconnected", executor])
            spans["0b. timer started -> fired, past the grace"].append(
                t_fired - t_started - started.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
                .total_seconds())
            spans["9. timer fired -> DEAD row"].append(audit["executor.dead", executor] - t_fired)
        timed_out += sum(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT for e in events)
        fired = next((n for n, e in enumerate(events) if e.event_type == EventType.EVENT_TYPE_TIMER_FIRED), None)
        if fired is None:
            continue
        steps = [(e.event_type, e.event_time.ToDatetime().timestamp()) for e in events[fired:]]
        names = {EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED: "wft scheduled",
                 EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT: "wft timed out",
                 EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED: "wft started",
                 EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED: "wft completed",
                 EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: "activity scheduled",
                 EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED: "activity started",
                 EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "activity completed"}
        path = [("timer fired", steps[0][1])] + [(names[t], at) for t, at in steps[1:] if t in names][:8]
        for n, ((a, ta), (b, tb)) in enumerate(zip(path, path[1:], strict=False)):
            spans[f"{n + 1}. {a} -> {b}"].append(tb - ta)
    log(f"  workflow tasks timed out (a sticky queue not polled in time): {timed_out}")
    for span, values in sorted(spans.items()):
        log(f"  {span}: p50 {percentile(values, 50):.3f} p99 {percentile(values, 99):.3f} s")


def _emit(path: Path, lines: list[str]) -> None:
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    print(text)


if __name__ == "__main__":
    raise_nofile()
    what, args = sys.argv[1], [float(a) for a in sys.argv[2:]]
    if what == "memory":
        memory(int(args[0]) if args else 2000)
    elif what == "cpu-heartbeat":
        cpu_heartbeat(int(args[0]) if args else 5000, args[1] if len(args) > 1 else 500,
                      args[2] if len(args) > 2 else 20)
    elif what == "cpu-storm":
        cpu_storm(int(args[0]) if args else 1000)
    elif what == "bursts":
        bursts(int(args[0]) if args else 1000, int(args[1]) if len(args) > 1 else 100,
               int(args[2]) if len(args) > 2 else 3)
    elif what == "cpu-burst":
        cpu_burst(int(args[0]) if args else 1000, int(args[1]) if len(args) > 1 else 100,
                  int(args[2]) if len(args) > 2 else 15)
    else:
        sys.exit(__doc__)
