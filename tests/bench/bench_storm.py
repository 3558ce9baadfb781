"""P3 (connect storm), P4 (liveness precision) and P6 (reconnect storm), on one Relay stack: embedded
Temporal dev server, `relay worker`, `relay gateway`, plus the P3 baseline's trivial worker, a real DBOS
executor as a canary, and one load generator.

- P3: the baseline first — N concurrent raw ``start_workflow(..., start_signal=...)`` calls for a trivial
  workflow on the same dev server — then N fake executors connect at once; registrations per second is N
  over (last ``executor.healthy`` audit time − the moment the storm began).
- P4: on those N connected executors, the app's ``executorTimeoutSecs`` is set to 3 and a number of them
  close at once (the generator notes each close's wall-clock time). From the audit log:
  DISCONNECTED − close, and DEAD − DISCONNECTED − grace. The others are live peers of the same version, so
  each DEAD executor is recovered (the generator answers ``recovery`` and ``exist_pending_workflows``).
- P6: N executors of another app (grace 30 s) drop at once (TCP abort) and reconnect at once with the same
  ids. All must be HEALTHY again within 30 s, and once the grace has passed there must be no
  ``executor.dead`` row (no recovery).
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from tests.bench.common import (
    PYTHON,
    ROOT,
    Generator,
    Proc,
    Results,
    Stack,
    canary_report,
    cpu_seconds,
    epoch,
    log,
    percentile,
    scaled,
    start_canary,
    start_stack,
)
from tests.support import wait_until

P3_APP, P6_APP = "storm", "reconnect"
P4_GRACE = 3
RECOVERY_WAIT_S = 60  # how long P4 waits for recoveries to be confirmed (reported, not a target)
P4_CLOSES_PER_S = 4.0  # the one-by-one closes: 200 over 50 s
P6_GRACE = 30


def _trivial_baseline(stack: Stack, n: int, worker_pid: int, *, relay_polls: bool = False) -> dict[str, Any]:
    cmd = [PYTHON, "-m", "tests.bench.trivial", "storm", stack.temporal_address, str(n),
           *(["relay-polls"] if relay_polls else [])]
    procs = {"trivial_worker": worker_pid, "temporal": stack.temporal.pid}
    for attempt in (1, 2):
        cpu0 = _cpu(procs)
        with open(stack.data_dir / "trivial-storm.log", "ab") as err:
            done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True, timeout=300)
        if done.returncode == 0 or '"workflows_done"' in done.stdout:
            break  # a crash after the figures were printed (the SDK's threads at exit) measured all it should
        log(f"  P3 baseline attempt {attempt} exited with {done.returncode}; see {stack.data_dir}/trivial-storm.log")
    if '"workflows_done"' not in done.stdout:
        done.check_returncode()
    timing: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    calls = timing["calls_done"] - timing["t0"]
    finished = timing["workflows_done"] - timing["t0"]
    cpu_ms = _cpu_per(procs, cpu0, n)
    return {"calls_s": calls, "workflows_s": finished, "calls_per_s": n / calls, "workflows_per_s": n / finished,
            "attempts": attempt, "cpu_ms_per_workflow": cpu_ms}


def _cpu(procs: dict[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in procs.items()}


def _cpu_per(procs: dict[str, int], before: dict[str, float], n: int) -> dict[str, float]:
    """Milliseconds of CPU per item, per process, since ``before``."""
    return {name: round((cpu_seconds(pid) - before[name]) / n * 1000, 2) for name, pid in procs.items()}


def _p3(stack: Stack, gen: Generator, n: int) -> dict[str, Any]:
    stack.put_app(P3_APP)
    procs = {"gateway": stack.gateway.pid, "worker": stack.worker.pid, "temporal": stack.temporal.pid,
             "loadgen": gen.pid}
    cpu0 = _cpu(procs)
    reply = gen.call("connect", url=stack.executor_url(P3_APP), prefix="storm-", count=n, concurrency=n,
                     timeout=120)
    if reply["failed"]:
        log(f"  P3: {reply['failed']} executors failed to connect: {reply['errors']}")
    t0 = reply["t0"]
    stack.wait_healthy(P3_APP, n, timeout=300)
    cpu_ms = _cpu_per(procs, cpu0, n)
    last = max(t for _, _, t in stack.audit(P3_APP, ["executor.healthy"]))
    started = max(stack.workflow_start_times(P3_APP)) - t0
    return {"t0": t0, "connected_s": reply["t1"] - t0, "healthy_s": last - t0, "per_s": n / (last - t0),
            "started_s": started, "started_per_s": n / started, "cpu_ms_per_registration": cpu_ms,
            "handshake_p50_s": reply["latency_p50"], "handshake_p99_s": reply["latency_p99"],
            "failed": reply["failed"], "retries": reply["retries"]}


def _p4(stack: Stack, gen: Generator, start: int, count: int, spread: float,
        closed_out: dict[str, float] | None = None) -> dict[str, Any]:
    """Close executors ``storm-{start}..`` (evenly over ``spread`` seconds, or at once) and time the audit log's
    DISCONNECTED and DEAD rows against the generator's close times (copied into ``closed_out``)."""
    closed: dict[str, float] = gen.call("close", prefix="storm-", start=start, count=count, mode="close",
                                        spread=spread)["closed"]
    if closed_out is not None:
        closed_out.update(closed)
    since = min(closed.values()) - 1

    def rows(op: str) -> dict[str, float]:
        return {ex: t for _, ex, t in stack.audit(P3_APP, [op], since=since) if ex in closed}

    wait_until(lambda: len(rows("executor.dead")) >= len(closed), timeout=180, interval=0.25,
               what="every closed executor DEAD")
    disconnected, dead = rows("executor.disconnected"), rows("executor.dead")
    try:
        wait_until(lambda: len(rows("executor.deleted")) >= len(closed), timeout=RECOVERY_WAIT_S, interval=0.5,
                   what="every DEAD executor recovered")
    except AssertionError as err:
        log(f"  P4: {err}")
    deleted = rows("executor.deleted")
    to_disc = [disconnected[e] - closed[e] for e in closed]
    to_dead = [dead[e] - disconnected[e] - P4_GRACE for e in closed]
    # The whole way, close to DEAD past the grace: what the two figures above add up to for each executor.
    close_to_dead = [dead[e] - closed[e] - P4_GRACE for e in closed]
    to_deleted = [deleted[e] - dead[e] for e in deleted]
    # The whole way to the end, close to the record deleted (recovered and confirmed), past the grace; those not
    # deleted in time are left out here and counted in ``recovered``.
    close_to_deleted = [deleted[e] - closed[e] - P4_GRACE for e in deleted]
    failures = stack.audit_reasons(P3_APP, "executor.recovery.failed", since=since)
    return {
        "closed": len(closed), "spread_s": spread,
        "disconnected_p50_s": percentile(to_disc, 50), "disconnected_p99_s": percentile(to_disc, 99),
        "disconnected_max_s": max(to_disc),
        "dead_p50_s": percentile(to_dead, 50), "dead_p99_s": percentile(to_dead, 99), "dead_max_s": max(to_dead),
        "dead_min_s": min(to_dead),
        "close_to_dead_p50_s": percentile(close_to_dead, 50), "close_to_dead_p99_s": percentile(close_to_dead, 99),
        "close_to_deleted_p50_s": percentile(close_to_deleted, 50),
        "close_to_deleted_p99_s": percentile(close_to_deleted, 99),
        "recovered": len(deleted), "recovery_p50_s": percentile(to_deleted, 50),
        "recovery_p99_s": percentile(to_deleted, 99), "recovery_attempts_failed": sum(failures.values()),
        "recovery_failure_reasons": dict(failures.most_common(3)),
    }


def _p6(stack: Stack, gen: Generator, n: int) -> dict[str, Any]:
    stack.put_app(P6_APP, executorTimeoutSecs=P6_GRACE)
    url = stack.executor_url(P6_APP)
    reply = gen.call("connect", url=url, prefix="re-", count=n, concurrency=n, timeout=120)
    assert reply["failed"] == 0, reply
    stack.wait_healthy(P6_APP, n, timeout=300)
    time.sleep(2)
    dropped = gen.call("close", prefix="re-", count=n, mode="abort")["closed"]
    t_drop = min(dropped.values())
    again = gen.call("connect", url=url, prefix="re-", count=n, concurrency=n, timeout=120)
    try:
        t_healthy = stack.wait_healthy(P6_APP, n, since=t_drop, timeout=60)
        last = max(epoch(u) for (u,) in stack.query("SELECT updated_at FROM executor WHERE app = ?", (P6_APP,)))
        healthy_s = min(t_healthy, last) - t_drop
    except TimeoutError as err:
        log(f"  P6: {err}")
        healthy_s = float("inf")
    # No executor.dead can appear before the grace has run out since the last DISCONNECTED was recorded.
    disconnected = stack.audit(P6_APP, ["executor.disconnected"], since=t_drop)
    last_disc = max((t for _, _, t in disconnected), default=t_drop)
    wait_s = last_disc + P6_GRACE + 5 - time.time()
    log(f"  P6: all HEALTHY {healthy_s:.2f} s after the drop; waiting {wait_s:.0f} s past the grace")
    time.sleep(max(0.0, wait_s))
    dead = stack.audit(P6_APP, ["executor.dead"], since=t_drop)
    recoveries = stack.audit(P6_APP, ["executor.recovery.dispatched"], since=t_drop)
    ops: dict[str, int] = {}
    for op, _, _ in stack.audit(P6_APP, ["executor.disconnected", "executor.reconnected", "executor.superseded",
                                         "executor.healthy"], since=t_drop):
        ops[op] = ops.get(op, 0) + 1
    return {"reconnected": again["connected"], "reconnect_failed": again["failed"],
            "reconnect_handshakes_s": again["t1"] - again["t0"], "healthy_s": healthy_s,
            "dead": len(dead), "recoveries": len(recoveries), "audit_after_drop": ops,
            "final": stack.status_counts(P6_APP)}


def run(results: Results) -> None:
    n, n_close, n_burst = scaled(1000), scaled(200, 5), scaled(100, 5)
    log(f"P3/P4/P6: storms of {n}; P4 closes {n_close} one by one, then {n_burst} at once")
    stack = start_stack("storm")
    gen: Generator | None = None
    try:
        trivial = Proc("trivial-worker", [PYTHON, "-m", "tests.bench.trivial", "worker", stack.temporal_address],
                       env=stack.env, logdir=stack.data_dir)
        stack.extra.append(trivial)
        # The same workflow on a worker that polls as Relay's does: the baseline for Relay's own cost per
        # registration, the pollers being equal.
        relay_polls = Proc("trivial-worker-relay-polls", [PYTHON, "-m", "tests.bench.trivial", "worker",
                                                        stack.temporal_address, "relay-polls"],
                          env=stack.env, logdir=stack.data_dir)
        stack.extra.append(relay_polls)
        start_canary(stack)
        for w in (trivial, relay_polls):
            wait_until(lambda: "ready" in w.tail(), timeout=60, what=f"{w.name}")  # noqa: B023
        wait_until(lambda: stack.rest_executors("canary") != {}, timeout=120, what="canary HEALTHY")
        gen = Generator("loadgen-storm", stack.data_dir)

        log("P3 baseline: raw start_workflow(start_signal=...) calls")
        base = _trivial_baseline(stack, n, trivial.pid)
        log(f"  {base['calls_per_s']:.1f} calls/s ({base['workflows_per_s']:.1f} workflows done/s)")
        scaled_base = _trivial_baseline(stack, n, relay_polls.pid, relay_polls=True)
        log(f"  the worker polling as Relay's: {scaled_base['calls_per_s']:.1f} calls/s "
            f"({scaled_base['workflows_per_s']:.1f} workflows done/s); CPU ms per workflow "
            f"{scaled_base['cpu_ms_per_workflow']}")
        log("P3 relay: connect storm")
        p3 = _p3(stack, gen, n)
        log(f"  {p3['per_s']:.1f} registrations/s (all connected in {p3['connected_s']:.2f} s, "
            f"signal-with-start landed for all in {p3['started_s']:.2f} s, HEALTHY in {p3['healthy_s']:.2f} s); "
            f"CPU ms per registration {p3['cpu_ms_per_registration']} (baseline per workflow "
            f"{base['cpu_ms_per_workflow']})")
        results.compare("P3", f"registrations/s, {n:,} at once (vs start_workflow calls/s)", p3["per_s"],
                        base["calls_per_s"], "/s", min_ratio=0.8,
                        note="connected -> HEALTHY in the registry, over the whole storm")
        results.compare("P3", "gateway signal-with-starts landed/s (vs start_workflow calls/s)",
                        p3["started_per_s"], base["calls_per_s"], "/s",
                        note="the gateway's share alone: handshake + auth + signal-with-start, from Temporal's "
                             "workflow start times")
        results.compare("P3", "registrations/s (vs trivial workflows completed/s)", p3["per_s"],
                        base["workflows_per_s"], "/s",
                        note="a gentler baseline: the trivial workflow also processed its signal and ended")
        results.compare("P3", "registrations/s (vs trivial workflows, polled as Relay's are)", p3["per_s"],
                        scaled_base["workflows_per_s"], "/s",
                        note="the trivial workflow's worker polls for workflow tasks as Relay's does (40 polls, "
                             "not the SDK's default of 5 at most): Relay's own cost per registration")

        with stack.api() as client:
            client.patch(f"/v2/orgs/local/apps/{P3_APP}", json={"executorTimeoutSecs": P4_GRACE}).raise_for_status()
        time.sleep(1)
        p4 = {}
        runs = (("spread", 0, n_close, n_close / P4_CLOSES_PER_S), ("burst", n_close, n_burst, 0.0))
        for mode, start, count, spread in runs:
            how = f"{count} of {n} closed over {spread:g} s" if spread else f"{count} of {n} closed at once"
            log(f"P4 ({mode}): {how}")
            p4[mode] = m = _p4(stack, gen, start, count, spread)
            log(f"  DISCONNECTED - close p50 {m['disconnected_p50_s']:.3f} p99 {m['disconnected_p99_s']:.3f}; "
                f"DEAD - DISCONNECTED - grace p50 {m['dead_p50_s']:.3f} p99 {m['dead_p99_s']:.3f}; "
                f"{m['recovered']} recovered")
            results.absolute("P4", f"DISCONNECTED - close, p50 ({how})", m["disconnected_p50_s"], "s")
            results.absolute("P4", f"DISCONNECTED - close, p99 ({mode})", m["disconnected_p99_s"], "s", at_most=0.5)
            results.absolute("P4", f"DEAD - DISCONNECTED - grace, p50 ({mode})", m["dead_p50_s"], "s")
            results.absolute("P4", f"DEAD - DISCONNECTED - grace, p99 ({mode})", m["dead_p99_s"], "s", at_most=1.0)
            results.absolute("P4", f"DEAD - close - grace, p99 ({mode})", m["close_to_dead_p99_s"], "s",
                             note="the two figures above end to end, per executor: how late DEAD is for the executor")
            results.absolute("P4", f"deleted - close - grace, p99 ({mode})", m["close_to_deleted_p99_s"], "s",
                             at_most=5.0, note="recovered, confirmed and its record deleted, per executor: the "
                                               "time its workflows stood still past the grace")
            results.absolute("P4", f"recovered and deleted ({mode})", m["recovered"], "", equals=count)

        log("P6: reconnect storm")
        p6 = _p6(stack, gen, n)
        log(f"  HEALTHY again in {p6['healthy_s']:.2f} s; {p6['dead']} dead, {p6['recoveries']} recoveries")
        results.absolute("P6", f"all {n:,} HEALTHY again after the drop", p6["healthy_s"], "s", at_most=30)
        results.absolute("P6", "recoveries (executor.dead rows)", p6["dead"], "", equals=0)

        canary = canary_report(stack)
        results.absolute("P3-P6", "canary (real dbos executor) stayed HEALTHY", 1 if canary["ok"] else 0, "",
                         equals=1, note=str(canary))
        results.details["storm"] = {"p3_baseline": base, "p3": p3, "p4": p4, "p6": p6, "canary": canary,
                                    "generator": gen.call("stats")}
    finally:
        if gen is not None:
            gen.stop()
        stack.stop()
