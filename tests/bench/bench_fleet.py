"""P1 (memory per idle executor connection) and P2 (CPU per heartbeat), Relay's gateway against a bare
`websockets` server holding the same fleet, one after the other in the same run.

For each server: a few warm-up connections, then the fleet grows to 5,000 (batches of 500, each waited
for: for Relay, until the registry shows them HEALTHY, so no registration is still in flight), RSS read;
P2's idle and heartbeat windows at 5,000; the fleet grows to 10,000, RSS read again. Relay runs as
separate processes (`relay gateway`, `relay worker`, embedded Temporal) so the gateway's RSS and CPU are
its own.
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


@dataclass
class Target:
    kind: str  # "relay" or "baseline"
    pid: int
    url: str
    stack: Stack | None = None
    server: Proc | None = None

    def settle(self, count: int) -> None:
        """Wait until the server has finished taking on ``count`` connections of the app: for Relay, until the
        gateway's signal-with-start of each lifecycle workflow has landed in Temporal. (HEALTHY follows when the
        worker gets to it; on this machine the worker and Temporal record ~20-60 registrations/s, so waiting
        for HEALTHY would take minutes and measure the worker, not the gateway.)"""
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


def _measure(kind: str, n1: int, n2: int, rate: float, idle_s: float, load_s: float) -> dict[str, Any]:
    logdir = BENCH_DIR / f"fleet-{kind}"
    logdir.mkdir(parents=True, exist_ok=True)
    target = _start(kind, logdir)
    gen = Generator(f"loadgen-{kind}", logdir)
    out: dict[str, Any] = {}
    try:
        reply = gen.call("connect", url=target.url, prefix="warm-", count=WARM, concurrency=WARM, timeout=60)
        assert reply["failed"] == 0, reply
        if target.stack is not None:
            target.stack.wait_healthy(APP, WARM, timeout=60)
            target.stack.wait_healthy("canary", 1, timeout=120)
        time.sleep(2)
        rss0 = settled_rss(target.pid)
        out["rss_base"] = rss0
        log(f"  {kind}: base RSS {rss0 / 2**20:.1f} MiB with {WARM} warm-up connections")

        out["grow1"] = _grow(target, gen, 0, n1)
        time.sleep(3)
        rss1 = settled_rss(target.pid)
        out["rss_n1"] = rss1
        if target.stack is not None:
            out["registry_at_n1"] = target.stack.status_counts(APP)
        out["per_conn_n1"] = (rss1 - rss0) / n1
        log(f"  {kind}: RSS {rss1 / 2**20:.1f} MiB at {n1}: {(rss1 - rss0) / n1:,.0f} B per connection")

        # P2: CPU with the fleet idle (server pings only), then with heartbeats at `rate` frames/s.
        wait_quiet(target.pid, below=0.3, timeout=30)
        c0, t0 = cpu_seconds(target.pid), time.monotonic()
        time.sleep(idle_s)
        idle_cpu, idle_wall = cpu_seconds(target.pid) - c0, time.monotonic() - t0
        gen.call("ping", prefix=PREFIX, start=0, count=n1, rate=rate, duration=load_s)
        c0, t0 = cpu_seconds(target.pid), time.monotonic()
        time.sleep(load_s)
        load_cpu, load_wall = cpu_seconds(target.pid) - c0, time.monotonic() - t0
        pings = gen.call("ping_result")
        frames = pings["sent"]
        out["p2"] = {
            "idle_cpu_s": idle_cpu, "idle_wall_s": idle_wall, "load_cpu_s": load_cpu, "load_wall_s": load_wall,
            "frames": frames, "pongs": pings["pongs"], "rate": frames / (pings["t1"] - pings["t0"]),
            "per_frame_gross_us": load_cpu / frames * 1e6,
            "per_frame_net_us": (load_cpu - idle_cpu / idle_wall * load_wall) / frames * 1e6,
            "idle_cores": idle_cpu / idle_wall, "load_cores": load_cpu / load_wall,
        }
        log(f"  {kind}: P2 {frames} heartbeats ({pings['pongs']} pongs) in {load_wall:.1f} s: "
            f"{out['p2']['per_frame_gross_us']:.1f} us/frame gross, {out['p2']['per_frame_net_us']:.1f} net "
            f"(idle {out['p2']['idle_cores']:.3f} cores, load {out['p2']['load_cores']:.3f})")

        out["grow2"] = _grow(target, gen, n1, n2)
        time.sleep(3)
        rss2 = settled_rss(target.pid)
        out["rss_n2"] = rss2
        out["per_conn_n2"] = (rss2 - rss0) / n2
        out["hwm"] = hwm_bytes(target.pid)
        log(f"  {kind}: RSS {rss2 / 2**20:.1f} MiB at {n2}: {(rss2 - rss0) / n2:,.0f} B per connection")
        out["generator"] = gen.call("stats")
        if target.stack is not None:
            out["canary"] = canary_report(target.stack)
            out["registry_at_end"] = target.stack.status_counts(APP)
    finally:
        gen.stop()
        target.stop()
    return out


def run(results: Results) -> None:
    n1, n2 = scaled(5000), scaled(10000)
    rate = scaled(500)  # 5,000 executors each pinging every 10 s
    idle_s, load_s = (20.0, 30.0) if SCALE >= 0.5 else (8.0, 10.0)
    log(f"P1/P2: fleets of {n1} and {n2}, heartbeats at {rate}/s")
    measured = {}
    for kind in ("baseline", "relay"):
        log(f"P1/P2 {kind}")
        measured[kind] = _measure(kind, n1, n2, rate, idle_s, load_s)
    base, relay = measured["baseline"], measured["relay"]
    results.details["p1_p2"] = measured
    for n, key in ((n1, "per_conn_n1"), (n2, "per_conn_n2")):
        results.compare("P1", f"RSS per idle connection @ {n:,}", relay[key], base[key], "B", max_ratio=1.3)
    gen_relay = relay["generator"]
    lost = gen_relay.get("unexpected_closes", 0) + measured["baseline"]["generator"].get("unexpected_closes", 0)
    if lost:
        results.details["p1_p2_unexpected_closes"] = lost
    results.compare("P2", f"CPU per heartbeat @ {rate}/s, {n1:,} conns (gross)",
                    relay["p2"]["per_frame_gross_us"], base["p2"]["per_frame_gross_us"], "us", max_ratio=1.3,
                    note="all of the server process's CPU in the window / heartbeats sent (idle work included)")
    results.compare("P2", "CPU per heartbeat (net of idle)", relay["p2"]["per_frame_net_us"],
                    base["p2"]["per_frame_net_us"], "us",
                    note="(window CPU - idle CPU rate x window) / heartbeats: the heartbeat handling alone")
    results.compare("P2", f"idle CPU, {n1:,} conns", relay["p2"]["idle_cores"] * 100,
                    base["p2"]["idle_cores"] * 100, "% core")
    canary = relay.get("canary", {})
    results.absolute("P1", "canary (real dbos executor) stayed HEALTHY", 1 if canary.get("ok") else 0, "",
                     equals=1, note=str(canary))
