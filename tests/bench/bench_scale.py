"""`scale`: a fleet of 10,000 protocol executors across 3 `relay gateway`s and 2 `relay worker`s on PostgreSQL.

Opt-in, not in the default `make bench` set: the full fleet took 17 minutes on the 2-core machine (connecting it
alone about 8), over the suite's budget; ``BENCH_SCALE=0.05`` takes about 4 (its phases wait out fixed graces).

    .venv/bin/python -m tests.bench scale                    # 10,000 executors
    BENCH_SCALE=0.05 .venv/bin/python -m tests.bench scale   # 500: a quick pass
    make bench PARTS=scale
    BENCH_SCALE_PY_SPY=1 PY_SPY=... .venv/bin/python -m tests.bench scale  # py-spy on each worker through the close
    BENCH_SCALE_SEGMENTS=1 .venv/bin/python -m tests.bench scale  # the close's steps, from the histories

Processes: a private PostgreSQL cluster (Debian's binaries, ``tests.postgres``: fsync off, as in the tests) holding
Relay's database, the embedded Temporal dev server (``temporal_command``, with its Prometheus metrics on), 2 `relay
worker`s, 3 `relay gateway`s (own ``RELAY_PORT`` and ``RELAY_GATEWAY_ID`` each), and 3 load generators, one per
gateway, each holding a third of the fleet. Phases, in order, each read around with the figures below:

1. connect: the fleet connects in waves of ``SCALE_WAVE`` (1,000; 0: all at once), each at once (``CONCURRENCY``
   handshakes in flight per generator), the next once it is HEALTHY: time until every registry row is HEALTHY. An
   executor whose socket is closed under it (a gateway that fenced itself, out of contact with an overloaded
   Temporal) reconnects a second later, as the SDKs do (the generators' ``reconnect``). All 10,000 at once did not
   converge here: the dev server fell behind the gateways' signal-with-starts (retried on timeouts), the gateways
   lost contact and fenced themselves, and their executors' reconnects added more.
2. steady: ``STEADY_S`` seconds with nothing happening but the gateways' pings: the fleet's idle cost. RSS of every
   gateway and worker is read at its end.
3. gateway kill: one gateway is SIGKILLed; its executors reconnect a second later, as the SDKs do, to its URL
   (refused), then to any gateway at random (as behind a load balancer), so spread over the two others. Time until
   all are HEALTHY on the survivors, within the app's grace (``executorTimeoutSecs`` ``GRACE_S``).
4. after the kill: the dead gateway is found gone (its heartbeat timeout, probed, then as long again) and the grace
   runs out: recoveries dispatched (``executor.recovery.dispatched``) and ``executor.dead`` since the kill must be 0.
5. close 10 %: a tenth of the fleet (from every generator) closes at once: all recovered (``executor.deleted``), none
   held (``executor.recovery.held``), time to all recovered.

Around each phase: PostgreSQL's rows written (inserted + updated + deleted, ``pg_stat_database``; backends report
their counters within 10 s of going idle, so each phase is read ``SETTLE_S`` after its end, its rates over its own
duration), WAL bytes and transactions (reads too: a read-only session ends in a rollback, counted), connections in
use (``pg_stat_activity``, sampled every second), CPU of every process (``/proc``) (all in ``tests.bench.monitor``),
and Temporal actions counted two ways: with ``tests.bench.actions``' rules over every workflow history, bucketed by
event time (the figure reported), and the dev server's own ``action`` metric (Temporal's way to estimate actions on a
self-hosted server), reported beside it: it also counts activity heartbeats, and the ``TemporalChangeVersion``
upserts that the rules leave out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.bench import actions, profile
from tests.bench.common import (
    ORG,
    RELAY,
    Generator,
    Proc,
    Results,
    Stack,
    epoch,
    hwm_bytes,
    log,
    percentile,
    rss_bytes,
    scaled,
    start_stack,
)
from tests.bench.monitor import Monitor, samples
from tests.postgres import postgres_cluster
from tests.support import free_port, healthy, wait_until

APP = "scale"
GATEWAYS, WORKERS = 3, 2
GRACE_S = 30
CLOSE_SHARE = 0.1
CONCURRENCY = 200  # handshakes in flight per generator
WAVE = int(os.environ.get("SCALE_WAVE", "1000"))  # executors connecting at once, per wave (0: all)
STEADY_S = 20.0
HEARTBEAT_TIMEOUT_S = 10.0  # RELAY_GATEWAY_HEARTBEAT_TIMEOUT_SECS, the default


# -- the fleet ---------------------------------------------------------------------------------------------


@dataclass
class Fleet:
    stack: Stack
    ports: list[int]
    gateways: list[Proc]
    workers: list[Proc]
    gens: list[Generator]
    per: int  # executors per generator

    def ws(self, i: int) -> str:
        return f"ws://127.0.0.1:{self.ports[i]}/websocket/{APP}/{self.stack.key}"

    def each(self, call: Callable[[int, Generator], dict[str, Any]]) -> list[dict[str, Any]]:
        """``call`` on every generator at once (each blocks on its own control channel)."""
        pool = ThreadPoolExecutor(len(self.gens))
        try:
            return list(pool.map(call, range(len(self.gens)), self.gens))
        finally:  # on Ctrl-C, not waiting for replies that come only once the generators are stopped
            pool.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict[str, int]:
        """The generators' counters together: sockets closed under them, reconnects and failed attempts."""
        total: Counter[str] = Counter()
        for gen in self.gens:
            reply = gen.call("stats")
            total.update({k: reply.get(k, 0) for k in ("unexpected_closes", "redials", "redial_failures")})
        return dict(total)

    def count(self, where: str = "", *params: Any) -> int:
        rows = self.stack.query(f"SELECT COUNT(*) FROM executor WHERE org = ? AND app = ? {where}", (ORG, APP, *params))
        return int(rows[0][0])


def _start(stack: Stack, n: int, cleanup: contextlib.ExitStack) -> Fleet:
    """The other gateways and workers (stopped with the stack) and the generators (each stopped by ``cleanup``)."""
    ports, gateways = [int(stack.env["RELAY_PORT"])], [stack.gateway]
    for i in range(1, GATEWAYS):
        port = free_port()
        env = {**stack.env, "RELAY_PORT": str(port), "RELAY_GATEWAY_ID": f"bench-gateway-{i}"}
        gateways.append(Proc(f"gateway-{i}", [RELAY, "gateway"], env=env, logdir=stack.data_dir))
        stack.extra.append(gateways[-1])
        ports.append(port)
    workers = [stack.worker]
    for i in range(1, WORKERS):
        workers.append(Proc(f"worker-{i}", [RELAY, "worker"], env=stack.env, logdir=stack.data_dir))
        stack.extra.append(workers[-1])
    for port in ports:
        wait_until(lambda p=port: healthy(f"http://127.0.0.1:{p}"), timeout=60, what=f"gateway on {port}")
    fleet = Fleet(stack, ports, gateways, workers, [], n // GATEWAYS)
    for i in range(GATEWAYS):
        fleet.gens.append(Generator(f"loadgen-{i}", stack.data_dir))
        cleanup.callback(fleet.gens[-1].stop)
    return fleet


# -- the phases --------------------------------------------------------------------------------------------


def _connect(fleet: Fleet, mon: Monitor, n: int) -> dict[str, Any]:
    """The fleet connects in waves of ``WAVE`` (each at once, the next once it is HEALTHY; 0: all at once); an
    executor whose socket is closed under it (a fenced gateway) reconnects."""
    phase = mon.begin("connect", n)
    wave = fleet.per if WAVE <= 0 else max(1, WAVE // len(fleet.gens))
    replies: list[dict[str, Any]] = []
    progress: list[tuple[float, int]] = []
    for first in range(0, fleet.per, wave):
        count = min(wave, fleet.per - first)

        def connect(i: int, gen: Generator, first: int = first, count: int = count) -> dict[str, Any]:
            others = [fleet.ws(j) for j in range(len(fleet.gens)) if j != i]
            return gen.call("connect", url=fleet.ws(i), fallback_urls=others, reconnect=True, prefix=f"g{i}-",
                            start=first, count=count, concurrency=CONCURRENCY, timeout=600)

        replies += fleet.each(connect)
        _wait_healthy(fleet, (first + count) * len(fleet.gens), phase.start.at, progress)
    failed = sum(r["failed"] for r in replies)
    last = max(t for _, _, t in fleet.stack.audit(APP, ["executor.healthy"]))
    out = mon.end(phase, done_at=last)
    deaths = fleet.stack.audit(APP, ["executor.dead"], since=phase.start.at)
    out.update(healthy_s=round(last - phase.start.at, 2), per_s=round(n / (last - phase.start.at), 1),
               wave=wave * len(fleet.gens), failed=failed, retries=sum(r["retries"] for r in replies),
               dead=len(deaths), generators=fleet.stats(), progress=progress)
    log(f"  all {n} HEALTHY {out['healthy_s']} s after the first wave began ({out['per_s']}/s, waves of "
        f"{out['wave']}, {out['retries']} handshake retries); {len(deaths)} DEAD meanwhile; generators "
        f"{out['generators']}")
    return out


def _wait_healthy(fleet: Fleet, count: int, began: float, progress: list[tuple[float, int]]) -> None:
    """Until ``count`` executors are HEALTHY; a line every 30 s; fails when none turned HEALTHY for 5 minutes."""
    stalled = time.monotonic()
    best = 0
    while (healthy := fleet.count("AND status = 'HEALTHY'")) < count:
        if healthy > best:
            best, stalled = healthy, time.monotonic()
        elif time.monotonic() - stalled > 300:
            raise TimeoutError(f"{healthy}/{count} HEALTHY, none more for 5 minutes; generators {fleet.stats()}")
        if not progress or time.time() - began - progress[-1][0] >= 30:
            progress.append((round(time.time() - began), healthy))
            log(f"  {healthy:,} HEALTHY {time.time() - began:.0f} s in")
        time.sleep(1.0)


def _steady(fleet: Fleet, mon: Monitor, n: int) -> dict[str, Any]:
    phase = mon.begin("steady", n)
    time.sleep(STEADY_S)
    rss = {p.name: rss_bytes(p.pid) for p in [*fleet.gateways, *fleet.workers, fleet.stack.temporal]}
    out = mon.end(phase)
    out["rss"] = rss
    log("  RSS MiB: " + ", ".join(f"{k} {v / 2**20:.0f}" for k, v in rss.items()))
    return out


def _kill(fleet: Fleet, mon: Monitor, n: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """SIGKILL the last gateway; its executors reconnect by themselves (the generators' ``reconnect``), spread over
    the others."""
    victim = len(fleet.gateways) - 1
    prefix = f"g{victim}-"
    queues = fleet.stack.query("SELECT DISTINCT gateway_queue FROM executor WHERE app = ? AND executor_id LIKE ?",
                               (APP, prefix + "%"))
    assert len(queues) == 1, queues
    queue = queues[0][0]
    before = fleet.stats()
    connected_before = _connected(fleet, skip=victim)
    phase = mon.begin("gateway kill", fleet.per)
    fleet.gateways[victim].kill()
    t_kill = time.time()
    curve: list[tuple[float, int]] = []  # (seconds after the kill, executors HEALTHY elsewhere) at each look

    def moved() -> bool:
        curve.append((time.time() - t_kill, fleet.count("AND status = 'HEALTHY' AND gateway_queue <> ?", queue)))
        return curve[-1][1] >= n

    try:
        wait_until(moved,
                   timeout=GRACE_S + 60 + fleet.per / 10, interval=0.5,
                   what="every executor HEALTHY on the surviving gateways")
        latest = fleet.stack.query("SELECT MAX(updated_at) FROM executor WHERE app = ? AND executor_id LIKE ?",
                                   (APP, prefix + "%"))
        done = min(time.time(), epoch(latest[0][0]))
    except AssertionError as err:
        log(f"  gateway kill: {err}")
        done = float("inf")
    out = mon.end(phase, done_at=min(done, time.time()))
    generators = {k: v - before.get(k, 0) for k, v in fleet.stats().items()}
    out.update(healthy_again_s=round(done - t_kill, 2), generators=generators,
               gateway_moves=_gateway_moves(fleet, skip=victim),
               connected_s=quantiles(_connected(fleet, skip=victim), connected_before))
    log(f"  all HEALTHY again {out['healthy_again_s']} s after the kill (grace {GRACE_S} s); generators {generators}; "
        f"moves written by the gateways {out['gateway_moves']}; handshake to connected landed and to move written "
        f"(s, bucket bounds) {out['connected_s']}")

    # The dead gateway is found gone within about three heartbeat timeouts; the executors it still held in the
    # registry then are disconnected, and their grace runs out GRACE_S later unless their reconnect landed.
    after = mon.begin("after the kill", fleet.per)
    gone = t_kill + 3 * HEARTBEAT_TIMEOUT_S + 5
    log(f"  waiting {gone + GRACE_S + 5 - time.time():.0f} s or more: the dead gateway found gone, the grace run out")
    time.sleep(max(0.0, gone - time.time()))
    last = max((t for _, _, t in fleet.stack.audit(APP, ["executor.disconnected"], since=t_kill)), default=gone)
    # At least STEADY_S in all, so the phase's rates are the fleet's after the kill rather than a division by ~0.
    time.sleep(max(0.0, max(gone, last) + GRACE_S + 5 - time.time(), after.start.at + STEADY_S - time.time()))
    aftermath = mon.end(after)
    ops = Counter(op for op, _, _ in fleet.stack.audit(APP, ["executor.disconnected", "executor.superseded",
                                                             "executor.reconnected", "executor.dead",
                                                             "executor.recovery.dispatched"], since=t_kill))
    out.update(audit_since_kill=dict(ops), dead=ops["executor.dead"],
               recoveries=ops["executor.recovery.dispatched"], final=fleet.stack.status_counts(APP),
               timeline=_timeline(fleet, prefix, queue, t_kill, [(t, k - (n - fleet.per)) for t, k in curve]))
    log(f"  since the kill: {dict(ops)}")
    return out, aftermath


def _timeline(fleet: Fleet, prefix: str, queue: str, t_kill: float, curve: list[tuple[float, int]]
              ) -> dict[str, Any]:
    """Seconds after the kill, as percentiles over the killed gateway's executors: their reconnects' handshakes
    done (the generators), their registry rows HEALTHY elsewhere (as the bench looked: by a gateway's move or by the
    workflow), the workflows' audit of the move (the workflow writes the row again then, so the rows' last writes
    are the same times); when the dead gateway was recorded gone; and the trail of the rows written last."""
    def spread(values: list[float]) -> dict[str, float]:
        return {f"p{q}": round(percentile(values, q), 2) for q in (50, 90, 99, 100)} | {"n": len(values)}

    redialed = [t - t_kill for r in fleet.each(lambda _, gen: gen.call("redialed_at", since=t_kill)) for t in r["at"]]
    rows = fleet.stack.query("SELECT executor_id, updated_at FROM executor WHERE app = ? AND executor_id LIKE ? "
                             "AND gateway_queue <> ?", (APP, prefix + "%", queue))
    written = {ex: epoch(t) - t_kill for ex, t in rows}
    audited: dict[str, float] = {}
    trail: dict[str, list[tuple[str, float]]] = {}
    for op, ex, t in sorted(fleet.stack.audit(APP, ["executor.reconnected", "executor.superseded",
                                                    "executor.disconnected", "executor.healthy"], since=t_kill),
                            key=lambda row: row[2]):
        if ex.startswith(prefix):
            audited.setdefault(ex, t - t_kill)
            trail.setdefault(ex, []).append((op, round(t - t_kill, 2)))
    gone = fleet.stack.query("SELECT gone_at, gone_reason FROM gatewayprocess WHERE queue = ?", (queue,))
    last = sorted(written, key=written.__getitem__)[-5:]
    share = {f"p{q}": next((round(t, 2) for t, k in curve if k >= len(written) * q / 100), None)
             for q in (50, 90, 99, 100)}
    out = {"redialed": spread(redialed), "healthy_elsewhere": share, "audited": spread(list(audited.values())),
           "gone_s": round(epoch(gone[0][0]) - t_kill, 2) if gone and gone[0][0] is not None else None,
           "gone_reason": gone[0][1] if gone else None,
           "last": {ex: {"written": round(written[ex], 2), "trail": trail.get(ex, [])} for ex in last}}
    log(f"  timeline after the kill (s): {out}")
    return out


def _connected(fleet: Fleet, *, skip: int) -> dict[str, dict[float, float]]:
    """``relay_gateway_connected_seconds`` by stage, as cumulative counts per bucket bound, over the gateways but
    ``skip``."""
    total: dict[str, dict[float, float]] = {}
    for text in _metrics(fleet, skip=skip):
        buckets(text, "relay_gateway_connected_seconds", "stage", into=total)
    return total


def _metrics(fleet: Fleet, *, skip: int) -> list[str]:
    """Each gateway's /metrics text, but ``skip``'s."""
    return [httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30,
                      headers={"authorization": f"Bearer {fleet.stack.key}"}).text
            for i, port in enumerate(fleet.ports) if i != skip]


def buckets(text: str, histogram: str, label: str, *, into: dict[str, dict[float, float]]
            ) -> dict[str, dict[float, float]]:
    """Add ``histogram``'s cumulative bucket counts in ``text`` to ``into``, by ``label``'s value and bucket bound."""
    for labels, value in samples(text, f"{histogram}_bucket"):
        by_bound = into.setdefault(labels[label], {})
        by_bound[float(labels["le"])] = by_bound.get(float(labels["le"]), 0.0) + value
    return into


def quantiles(after: dict[str, dict[float, float]], before: dict[str, dict[float, float]]) -> dict[str, Any]:
    """Per stage, the bucket bound under which 50, 90, 99 and 100 % of the observations between ``before`` and
    ``after`` fall (seconds), and their count."""
    out: dict[str, Any] = {}
    for stage, by_bound in after.items():
        delta = {le: n - before.get(stage, {}).get(le, 0.0) for le, n in sorted(by_bound.items())}
        count = delta.get(float("inf"), 0.0)
        out[stage] = {f"p{q}": next((le for le, n in delta.items() if n >= count * q / 100), None)
                      for q in (50, 90, 99, 100)} | {"n": count}
    return out


def _gateway_moves(fleet: Fleet, *, skip: int) -> dict[str, float]:
    """``relay_gateway_moves_total`` by outcome, over the gateways but ``skip`` (each one's /metrics)."""
    total: dict[str, float] = {}
    for text in _metrics(fleet, skip=skip):
        for labels, value in samples(text, "relay_gateway_moves"):
            total[labels.get("outcome", "")] = total.get(labels.get("outcome", ""), 0.0) + value
    return total


def _close(fleet: Fleet, mon: Monitor, n: int) -> dict[str, Any]:
    """A tenth of the fleet, from every generator, closes at once."""
    each = max(1, round(fleet.per * CLOSE_SHARE))
    spy = _spy_on_workers(fleet)
    phase = mon.begin("close 10 %", each * len(fleet.gens))
    replies = fleet.each(lambda i, gen: gen.call("close", prefix=f"g{i}-", count=each, mode="close"))
    closed: dict[str, float] = {k: v for r in replies for k, v in r["closed"].items()}
    t_close = min(closed.values())

    def rows(op: str) -> dict[str, float]:
        return {ex: t for _, ex, t in fleet.stack.audit(APP, [op], since=t_close - 1) if ex in closed}

    try:
        wait_until(lambda: len(rows("executor.deleted")) >= len(closed), timeout=GRACE_S + 120 + len(closed) / 5,
                   interval=1.0, what="every closed executor recovered")
    except AssertionError as err:
        log(f"  close: {err}")
    deleted, dead, disconnected = rows("executor.deleted"), rows("executor.dead"), rows("executor.disconnected")
    done = max(deleted.values(), default=time.time())
    out = mon.end(phase, done_at=done)
    held = fleet.stack.audit(APP, ["executor.recovery.held"], since=t_close - 1)
    tripped = fleet.stack.audit(APP, ["app.recovery.breaker_tripped"], since=t_close - 1)
    to_dead = [dead[e] - disconnected[e] - GRACE_S for e in dead if e in disconnected]
    to_deleted = [deleted[e] - dead[e] for e in deleted if e in dead]
    out.update(closed=len(closed), recovered=len(deleted), held=len(held), breaker_tripped=len(tripped),
               recovered_s=round(done - t_close, 2),
               disconnected_p99_s=round(percentile([disconnected[e] - closed[e] for e in disconnected], 99), 3),
               dead_late_p99_s=round(percentile(to_dead, 99), 3),
               dead_to_deleted_p50_s=round(percentile(to_deleted, 50), 3),
               dead_to_deleted_p99_s=round(percentile(to_deleted, 99), 3),
               failures=dict(fleet.stack.audit_reasons(APP, "executor.recovery.failed", since=t_close - 1)),
               final=fleet.stack.status_counts(APP))
    log(f"  {len(deleted)}/{len(closed)} recovered {out['recovered_s']} s after the close (grace {GRACE_S} s); "
        f"{len(held)} held; DEAD -> deleted p50 {out['dead_to_deleted_p50_s']} s, p99 {out['dead_to_deleted_p99_s']} s")
    if os.environ.get("BENCH_SCALE_SEGMENTS"):  # where the time went, from every closed executor's history
        profile.segments(fleet.stack, sorted(closed), closed, app=APP)
    for raw, proc in spy:
        proc.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
        proc.wait()
        if raw.exists():
            for line in profile.summarize(raw, f"py-spy, {raw.stem}, the close"):
                log(line)
    return out


def _spy_on_workers(fleet: Fleet) -> list[tuple[Path, subprocess.Popen[bytes]]]:
    """BENCH_SCALE_PY_SPY=1: py-spy on every worker through the close (``tests.bench.profile``'s settings)."""
    if not os.environ.get("BENCH_SCALE_PY_SPY"):
        return []
    folder = profile.OUT / "scale-close"
    folder.mkdir(parents=True, exist_ok=True)
    seconds = GRACE_S + 120 + fleet.per * len(fleet.gens) * CLOSE_SHARE / 5
    return [(folder / f"{w.name}.txt", profile.record(w.pid, seconds, folder / f"{w.name}.txt"))
            for w in fleet.workers]


# -- the bench ---------------------------------------------------------------------------------------------


def run(results: Results) -> None:
    n = scaled(10000, minimum=30) // GATEWAYS * GATEWAYS
    log(f"scale: {n:,} executors over {GATEWAYS} gateways and {WORKERS} workers, on PostgreSQL")
    began = time.monotonic()
    # Unwound in reverse, each step whatever the others did: the monitor, the generators, the stack, the cluster.
    with postgres_cluster() as cluster, contextlib.ExitStack() as cleanup:
        db_url = cluster.create_database("relay")
        metrics_port = free_port()
        stack = start_stack("scale", temporal_args=["--metrics-port", str(metrics_port)], RELAY_DATABASE_URL=db_url,
                            RELAY_GATEWAY_ID="bench-gateway-0", RELAY_SHUTDOWN_DRAIN_SECS="0")
        cleanup.callback(stack.stop)
        fleet = _start(stack, n, cleanup)
        stack.put_app(APP, executorTimeoutSecs=GRACE_S)
        assert cluster.process is not None
        pids = {**{p.name: [p.pid] for p in [*fleet.gateways, *fleet.workers]},
                "temporal": [stack.temporal.pid], "loadgens": [g.pid for g in fleet.gens],
                "postgres": [cluster.process.pid]}
        mon = Monitor(db_url, f"http://127.0.0.1:{metrics_port}/metrics", pids)
        cleanup.callback(mon.close)
        phases: dict[str, Any] = {}
        log(f"scale connect: {n:,} in waves of {WAVE or n:,}")
        phases["connect"] = _connect(fleet, mon, n)
        log(f"scale steady: {STEADY_S:g} s")
        phases["steady"] = _steady(fleet, mon, n)
        log("scale gateway kill")
        phases["gateway kill"], phases["after the kill"] = _kill(fleet, mon, n)
        log("scale close 10 %")
        phases["close 10 %"] = _close(fleet, mon, n)
        hwm = {p.name: hwm_bytes(p.pid) for p in [*fleet.gateways[:-1], *fleet.workers, stack.temporal]}
        log("scale: counting Temporal actions in the histories")
        counted = actions.count_live(stack.temporal_address, {name: p["window"] for name, p in phases.items()})
        log(f"  {counted['runs']} runs counted in {counted['seconds_to_count']} s")
    minutes = (time.monotonic() - began) / 60
    _report(results, n, phases, counted, hwm, minutes)


def _report(results: Results, n: int, phases: dict[str, Any], counted: dict[str, Any], hwm: dict[str, int],
            minutes: float) -> None:
    for name, p in phases.items():
        p["temporal_actions"] = counted[name]
        total = sum(counted[name].values())
        p["temporal_actions_total"] = total
        p["temporal_actions_per_s"] = round(total / p["seconds"], 1)
        p["temporal_actions_per_executor"] = round(total / max(1, p["affected"]), 2)
        p["workflow_tasks_timed_out"] = counted["workflow_tasks_timed_out"][name]
    results.details["scale"] = {"executors": n, "phases": phases, "hwm": hwm, "minutes": round(minutes, 1),
                                "history_runs": counted["runs"]}
    c, k, a, z = phases["connect"], phases["gateway kill"], phases["after the kill"], phases["close 10 %"]
    results.absolute("scale", f"time to all {n:,} HEALTHY (3 gateways, 2 workers, PostgreSQL)", c["healthy_s"], "s",
                     note=f"{c['per_s']}/s, in waves of {c['wave']:,}; {c['retries']} handshake retries")
    results.absolute("scale", "connect: executors DEAD meanwhile", c["dead"], "", equals=0,
                     note=f"sockets closed under the generators, reconnects: {c['generators']}")
    results.absolute("scale", "gateway SIGKILLed: recoveries dispatched", k["recoveries"], "", equals=0,
                     note=f"and {k['dead']} executor.dead; audit since the kill {k['audit_since_kill']}")
    results.absolute("scale", f"gateway SIGKILLed: its {k['affected']:,} HEALTHY again elsewhere", k["healthy_again_s"],
                     "s", at_most=GRACE_S, note=f"generators since the kill: {k['generators']}")
    results.absolute("scale", f"{z['closed']:,} closed at once: not recovered", z["closed"] - z["recovered"], "",
                     equals=0, note=f"recovery attempts failed: {z['failures'] or 'none'}")
    results.absolute("scale", "closed at once: recoveries held", z["held"], "", equals=0,
                     note=f"breaker tripped {z['breaker_tripped']} times")
    results.absolute("scale", "closed at once: time to all recovered", z["recovered_s"], "s",
                     note=f"grace {GRACE_S} s included; p99 of DISCONNECTED - close {z['disconnected_p99_s']} s, "
                          f"DEAD - DISCONNECTED - grace {z['dead_late_p99_s']} s; DEAD -> deleted p50 "
                          f"{z['dead_to_deleted_p50_s']} s, p99 {z['dead_to_deleted_p99_s']} s")
    steady = phases["steady"]
    for kind, what in (("gateway", f"; {n // GATEWAYS:,} sockets each"), ("worker", "")):
        rss = [v for name, v in steady["rss"].items() if name.startswith(kind)]
        results.absolute("scale", f"RSS per {kind} (max of {len(rss)})", max(rss), "B",
                         note=", ".join(f"{v / 2**20:.0f} MiB" for v in rss) + what)
    results.absolute("scale", "PostgreSQL connections in use, max", max(p["pg_connections_max"]
                                                                        for p in phases.values()), "",
                     note="pg_stat_activity of Relay's database, every second; by phase: " +
                          ", ".join(f"{name} {p['pg_connections_max']}" for name, p in phases.items()))
    for name, p in (("connect", c), ("steady", steady), ("gateway kill", k), ("after the kill", a),
                    ("close 10 %", z)):
        results.absolute("scale", f"{name}: PostgreSQL rows written/s", p["rows_written_per_s"], "/s",
                         note=f"{p['wal_kib_per_s']} KiB WAL/s, {p['transactions_per_s']} transactions/s (reads "
                              f"too); per executor affected {p['rows_per_executor']} rows, "
                              f"{p['wal_kib_per_executor']} KiB WAL, {p['transactions_per_executor']} transactions")
        results.absolute("scale", f"{name}: Temporal actions/s (histories)", p["temporal_actions_per_s"], "/s",
                         note=f"{p['temporal_actions_per_executor']} per executor affected; server action "
                              f"metric {p['server_actions']:.0f} in all; workflow tasks timed out "
                              f"{p['workflow_tasks_timed_out']}")
    log(f"scale took {minutes:.1f} minutes")
