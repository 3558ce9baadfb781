"""P1 (memory per idle executor connection) and P2 (CPU per heartbeat), Relay's gateway against a bare
`websockets` server holding the same fleet, in the same run.

For each server: a few warm-up connections, then the fleet grows to 5,000 (batches of 500, each waited
for), RSS read. With both fleets held at once, P2's idle and heartbeat windows alternate between the two servers,
three times each, so that a change in the machine's load lands on both (Relay's registrations have all landed by
then). Then each fleet grows to 10,000, RSS read again. Relay runs as separate processes (`relay gateway`,
`relay worker`, embedded Temporal) so the gateway's RSS and CPU are its own.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.bench.common import (
    BENCH_DIR,
    PYTHON,
    SCALE,
    Generator,
    Proc,
    Results,
    Stack,
    canary_report,
    cpu_seconds,
    hwm_bytes,
    log,
    scaled,
    settled_rss,
    start_canary,
    start_stack,
    wait_quiet,
)
from tests.support import free_port, wait_until

APP = "fleet"
PREFIX = "fleet-"
WARM = 20
BATCH = 500
CONCURRENCY = 100
P2_ROUNDS = 3  # the spread of one window is about ±15 %: three of each side narrow the mean
SERVER_PING_INTERVAL_S = 20.0  # Relay's default RELAY_SERVER_PING_INTERVAL_SECS and websockets' default ping_interval


@dataclass
class Target:
    kind: str  # "relay" or "baseline"
    pid: int
    url: str
    stack: Stack | None = None
    server: Proc | None = None

    def settle(self, count: int) -> None:
        """Wait until the server has finished taking on ``count`` connections of the app: for Relay, until the
        gateway's signal-with-start of each lifecycle workflow has landed in Temporal, so the RSS read next is the
        gateway's with every socket registered on its side. (HEALTHY follows as the worker gets to it; ``_open``
        waits for that once, before the P2 windows.)"""
        if self.stack is not None:
            stack = self.stack
            wait_until(lambda: stack.count_workflows(APP) >= count, timeout=600, interval=0.5,
                       what=f"{count} lifecycle workflows started")

    def stop(self) -> None:
        if self.stack is not None:
            self.stack.stop()
        if self.server is not None:
            self.server.stop()


def _start(kind: str, logdir: Path) -> Target:
    if kind == "baseline":
        port = free_port()
        server = Proc("baseline-server", [PYTHON, "-m", "tests.bench.baseline_server", str(port)],
                      env={"PATH": "/usr/bin:/bin"}, logdir=logdir)
        wait_until(lambda: _listening(port), timeout=30, what="baseline server")
        return Target(kind, server.pid, f"ws://127.0.0.1:{port}/websocket/{APP}/bench", server=server)
    stack = start_stack("fleet")
    stack.put_app(APP)
    start_canary(stack)
    return Target(kind, stack.gateway.pid, stack.executor_url(APP), stack=stack)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _grow(target: Target, gen: Generator, start: int, stop: int) -> dict[str, Any]:
    """Connect executors ``start..stop-1`` in batches, waiting for each batch to be taken on."""
    began = time.monotonic()
    failed = 0
    for first in range(start, stop, BATCH):
        count = min(BATCH, stop - first)
        reply = gen.call("connect", url=target.url, prefix=PREFIX, start=first, count=count,
                         concurrency=CONCURRENCY, timeout=300)
        failed += reply["failed"]
        if reply["failed"]:
            log(f"  {target.kind}: {reply['failed']} of {count} failed to connect: {reply['errors']}")
        target.settle(WARM + first + count)
    elapsed = time.monotonic() - began
    log(f"  {target.kind}: {stop} connected ({stop - start} in {elapsed:.1f} s)")
    return {"seconds": round(elapsed, 1), "failed": failed}


@dataclass
class Side:
    """One server under test, its load generator and what was measured of it."""

    kind: str
    target: Target
    gen: Generator
    out: dict[str, Any]


def _open(kind: str, n1: int) -> Side:
    """Start the server, warm it up, read its base RSS, grow its fleet to ``n1`` and read the RSS again."""
    logdir = BENCH_DIR / f"fleet-{kind}"
    logdir.mkdir(parents=True, exist_ok=True)
    target = _start(kind, logdir)
    side = Side(kind, target, Generator(f"loadgen-{kind}", logdir), {"p2_windows": []})
    reply = side.gen.call("connect", url=target.url, prefix="warm-", count=WARM, concurrency=WARM, timeout=60)
    assert reply["failed"] == 0, reply
    if target.stack is not None:
        target.stack.wait_healthy(APP, WARM, timeout=60)
        target.stack.wait_healthy("canary", 1, timeout=120)
    time.sleep(2)
    out = side.out
    out["rss_base"] = rss0 = settled_rss(target.pid)
    log(f"  {kind}: base RSS {rss0 / 2**20:.1f} MiB with {WARM} warm-up connections")
    out["grow1"] = _grow(target, side.gen, 0, n1)
    time.sleep(3)
    out["rss_n1"] = rss1 = settled_rss(target.pid)
    if target.stack is not None:
        out["registry_at_n1"] = target.stack.status_counts(APP)
        # No registration still in flight (worker and Temporal busy) while the P2 windows run.
        target.stack.wait_healthy(APP, WARM + n1, timeout=900)
    out["per_conn_n1"] = (rss1 - rss0) / n1
    log(f"  {kind}: RSS {rss1 / 2**20:.1f} MiB at {n1}: {(rss1 - rss0) / n1:,.0f} B per connection")
    return side


def _p2_window(side: Side, n1: int, rate: float, idle_s: float, load_s: float) -> None:
    """One P2 measurement: CPU with the fleet idle (server pings only), then with heartbeats at ``rate``/s."""
    pid, gen = side.target.pid, side.gen
    wait_quiet(pid, below=0.3, timeout=30)
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(idle_s)
    idle_cpu, idle_wall = cpu_seconds(pid) - c0, time.monotonic() - t0
    gen.call("ping", prefix=PREFIX, start=0, count=n1, rate=rate, duration=load_s)
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(load_s)
    load_cpu, load_wall = cpu_seconds(pid) - c0, time.monotonic() - t0
    pings = gen.call("ping_result")
    frames = pings["sent"]
    window = {
        "idle_cpu_s": idle_cpu, "idle_wall_s": idle_wall, "load_cpu_s": load_cpu, "load_wall_s": load_wall,
        "frames": frames, "pongs": pings["pongs"], "rate": frames / (pings["t1"] - pings["t0"]),
        "per_frame_gross_us": load_cpu / frames * 1e6,
        "per_frame_net_us": (load_cpu - idle_cpu / idle_wall * load_wall) / frames * 1e6,
        "idle_cores": idle_cpu / idle_wall, "load_cores": load_cpu / load_wall,
    }
    side.out["p2_windows"].append(window)
    log(f"  {side.kind}: P2 {frames} heartbeats ({pings['pongs']} pongs) in {load_wall:.1f} s: "
        f"{window['per_frame_gross_us']:.1f} us/frame gross, {window['per_frame_net_us']:.1f} net "
        f"(idle {window['idle_cores']:.3f} cores, load {window['load_cores']:.3f})")


def _close(side: Side, n1: int, n2: int) -> None:
    """Grow the fleet to ``n2``, read the RSS, and stop everything of this side."""
    target, out = side.target, side.out
    try:
        out["grow2"] = _grow(target, side.gen, n1, n2)
        time.sleep(3)
        out["rss_n2"] = rss2 = settled_rss(target.pid)
        out["per_conn_n2"] = (rss2 - out["rss_base"]) / n2
        out["hwm"] = hwm_bytes(target.pid)
        log(f"  {side.kind}: RSS {rss2 / 2**20:.1f} MiB at {n2}: {out['per_conn_n2']:,.0f} B per connection")
        out["generator"] = side.gen.call("stats")
        if target.stack is not None:
            out["canary"] = canary_report(target.stack)
            out["registry_at_end"] = target.stack.status_counts(APP)
    finally:
        side.gen.stop()
        target.stop()


def _p2_mean(out: dict[str, Any], key: str) -> float:
    windows = out["p2_windows"]
    return float(sum(w[key] for w in windows) / len(windows))


def run(results: Results) -> None:
    n1, n2 = scaled(5000), scaled(10000)
    rate = scaled(500)  # 5,000 executors each pinging every 10 s
    # Each window lasts whole server ping intervals (20 s on both servers), so every window holds each socket's
    # server ping (and its pong) the same number of times. With 15 s and 20 s windows, a fleet whose pings came in
    # bunches (a batch of 500 connected at once) had them fall in one window or the next by chance: one baseline
    # idle window held 0.67 s of CPU, the next 0.01 s, and the gross figure swung by ±15 % from run to run.
    idle_s, load_s = (SERVER_PING_INTERVAL_S, SERVER_PING_INTERVAL_S) if SCALE >= 0.5 else (6.0, 8.0)
    log(f"P1/P2: fleets of {n1} and {n2}, heartbeats at {rate}/s")
    sides: list[Side] = []
    try:
        for kind in ("baseline", "relay"):
            log(f"P1/P2 {kind}: fleet of {n1}")
            sides.append(_open(kind, n1))
        # Both fleets held at once, P2 windows alternate (baseline, relay, baseline, relay, ...): a change in the
        # machine's load (other work, a noisy neighbour) lands on both sides, not on one.
        for round_ in range(1, P2_ROUNDS + 1):
            for side in sides:
                log(f"P2 round {round_}: {side.kind}")
                _p2_window(side, n1, rate, idle_s, load_s)
        while sides:
            side = sides.pop(0)
            log(f"P1 {side.kind}: fleet of {n2}")
            _close(side, n1, n2)
            results.details.setdefault("p1_p2", {})[side.kind] = side.out
    finally:
        for side in sides:
            side.gen.stop()
            side.target.stop()
    measured = results.details["p1_p2"]
    base, relay = measured["baseline"], measured["relay"]
    for n, key in ((n1, "per_conn_n1"), (n2, "per_conn_n2")):
        results.compare("P1", f"RSS per idle connection @ {n:,}", relay[key], base[key], "B", max_ratio=1.3)
    lost = relay["generator"].get("unexpected_closes", 0) + base["generator"].get("unexpected_closes", 0)
    if lost:
        results.details["p1_p2_unexpected_closes"] = lost
    results.compare("P2", f"CPU per heartbeat @ {rate}/s, {n1:,} conns (gross)",
                    _p2_mean(relay, "per_frame_gross_us"), _p2_mean(base, "per_frame_gross_us"), "us",
                    max_ratio=1.3, note="all of the server process's CPU in the window / heartbeats sent (idle work "
                                        f"included); mean of {P2_ROUNDS} windows per server, alternating")
    results.compare("P2", "CPU per heartbeat (net of idle)", _p2_mean(relay, "per_frame_net_us"),
                    _p2_mean(base, "per_frame_net_us"), "us",
                    note="(window CPU - idle CPU rate x window) / heartbeats: the heartbeat handling alone")
    results.compare("P2", f"idle CPU, {n1:,} conns", _p2_mean(relay, "idle_cores") * 100,
                    _p2_mean(base, "idle_cores") * 100, "% core")
    canary = relay.get("canary", {})
    results.absolute("P1", "canary (real dbos executor) stayed HEALTHY", 1 if canary.get("ok") else 0, "",
                     equals=1, note=str(canary))
