"""Readings around each phase of a benchmark that runs Relay on PostgreSQL (``bench_scale``): PostgreSQL's counters
(rows written, WAL, transactions) and connections in use, the Temporal dev server's ``action`` metric, and the CPU of
every process, so each phase's figures are the deltas between its two readings.

PostgreSQL's backends report their counters when they go idle, at most once a second and, when idle, within 10 s
(``PGSTAT_IDLE_INTERVAL``): ``Monitor.end`` waits ``SETTLE_S`` before its reading, so a phase's counts are whole.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.bench.common import cpu_seconds, log, pg_dsn

SETTLE_S = 11.0


@dataclass
class Reading:
    at: float
    pg: dict[str, int]
    server_actions: Counter[str]  # the dev server's ``action`` metric, by action_type
    cpu: dict[str, float]


@dataclass
class Phase:
    name: str
    affected: int
    start: Reading
    done_at: float = 0.0
    end: Reading | None = None
    connections: list[tuple[int, int]] = field(default_factory=list)  # (in use, active) every second

    @property
    def seconds(self) -> float:
        return self.done_at - self.start.at

    def figures(self) -> dict[str, Any]:
        assert self.end is not None
        delta = {k: self.end.pg[k] - self.start.pg[k] for k in self.start.pg}
        rows = delta["tup_inserted"] + delta["tup_updated"] + delta["tup_deleted"]
        transactions = delta["xact_commit"] + delta["xact_rollback"]  # a read-only session ends in a rollback
        cpu = {k: round(self.end.cpu[k] - self.start.cpu.get(k, 0.0), 2) for k in self.end.cpu}
        server = self.end.server_actions - self.start.server_actions
        return {"seconds": round(self.seconds, 2), "affected": self.affected, "window": (self.start.at, self.end.at),
                "rows_written_per_s": round(rows / self.seconds, 1),
                "wal_kib_per_s": round(delta["wal_bytes"] / self.seconds / 1024, 1),
                "transactions_per_s": round(transactions / self.seconds, 1), "pg": delta,
                "rows_per_executor": round(rows / max(1, self.affected), 2),
                "wal_kib_per_executor": round(delta["wal_bytes"] / max(1, self.affected) / 1024, 2),
                "transactions_per_executor": round(transactions / max(1, self.affected), 2),
                "pg_connections_max": max((c for c, _ in self.connections), default=0),
                "pg_connections_active_max": max((a for _, a in self.connections), default=0),
                "server_actions": sum(server.values()), "server_actions_by_type": dict(server),
                "cpu_s": cpu}


class Monitor:
    """PostgreSQL's counters and connections, the dev server's ``action`` metric and every process's CPU."""

    COUNTERS = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted", "wal_bytes")

    def __init__(self, db_url: str, metrics_url: str, pids: dict[str, list[int]]) -> None:
        import psycopg

        # Connected to the `postgres` database, so the monitor's own queries are not counted in Relay's.
        server, self.database = pg_dsn(db_url).rsplit("/", 1)
        self.reader = psycopg.connect(f"{server}/postgres", autocommit=True)
        self.sampler = psycopg.connect(f"{server}/postgres", autocommit=True)
        self.metrics_url, self.pids = metrics_url, pids
        self.last_cpu: dict[int, float] = {}
        self.phase: Phase | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        query = ("SELECT count(*), count(*) FILTER (WHERE state = 'active') FROM pg_stat_activity "
                 "WHERE datname = %s")
        while not self.stopping.wait(1.0):
            row = self.sampler.execute(query, (self.database,)).fetchone()
            if row is not None and self.phase is not None:
                self.phase.connections.append((int(row[0]), int(row[1])))

    def _cpu(self, pid: int) -> float:
        """A process's CPU seconds; a process gone keeps its last reading."""
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            self.last_cpu[pid] = cpu_seconds(pid)
        return self.last_cpu.get(pid, 0.0)

    def read(self) -> Reading:
        # WAL position: the bytes written to the cluster's log (every database's: Relay's is the only busy one).
        query = (f"SELECT {', '.join(self.COUNTERS[:-1])}, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0') "
                 "FROM pg_stat_database WHERE datname = %s")
        row = self.reader.execute(query, (self.database,)).fetchone()
        assert row is not None
        server: Counter[str] = Counter()
        for labels, value in samples(httpx.get(self.metrics_url, timeout=10).text, "action"):
            if labels.get("namespace") == "default":
                server[labels.get("action_type", "")] += round(value)
        # PostgreSQL: the postmaster and every backend seen so far (one that has exited keeps its last reading).
        self.pids["postgres"] = sorted({*self.pids["postgres"], *_children(self.pids["postgres"][0])})
        cpu = {name: sum(self._cpu(pid) for pid in pids) for name, pids in self.pids.items()}
        return Reading(time.time(), dict(zip(self.COUNTERS, map(int, row), strict=True)), server, cpu)

    def begin(self, name: str, affected: int) -> Phase:
        self.phase = Phase(name, affected, self.read())
        return self.phase

    def end(self, phase: Phase, *, done_at: float | None = None) -> dict[str, Any]:
        """The phase is over (at ``done_at``, default now): settle, read, and return its figures."""
        phase.done_at = done_at or time.time()
        time.sleep(SETTLE_S)
        phase.end = self.read()
        self.phase = None
        figures = phase.figures()
        log(f"  {phase.name}: {figures['seconds']} s; PostgreSQL {figures['rows_written_per_s']} rows written/s, "
            f"{figures['wal_kib_per_s']} KiB WAL/s, {figures['transactions_per_s']} transactions/s, up to "
            f"{figures['pg_connections_max']} connections ({figures['pg_connections_active_max']} active); "
            f"CPU s {figures['cpu_s']}")
        return figures

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.reader.close()
        self.sampler.close()


def samples(text: str, family: str) -> list[tuple[dict[str, str], float]]:
    """The samples of one metric family (``family`` or ``family_total``) in a Prometheus text exposition, parsed by
    ``prometheus_client`` rather than by splitting lines (a label value may hold a space, a comma or a brace)."""
    from prometheus_client.parser import text_string_to_metric_families

    return [(dict(sample.labels), float(sample.value)) for metrics in text_string_to_metric_families(text)
            for sample in metrics.samples if sample.name in (family, f"{family}_total")]


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out
