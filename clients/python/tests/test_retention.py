"""Retention on DBOS's public API: garbage collection by ``completed_at`` and by row count, in batches, and the global
timeout; the ``retention`` request that starts a round in the background.

Workflows are made old by writing their epoch-ms columns in the SQLite file (``support.set_times``). Each test works
in a time range of its own, in 2001, far before anything the other tests run, and deletes what it made.
"""

from __future__ import annotations

import logging
import random
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from dbos import DBOS, SetEnqueueOptions, SetWorkflowID

import relay_dbos.retention
from relay_dbos.operations import Operations
from relay_dbos.retention import FINISHED, Retention, iso_at, run_round
from tests import dbos_app
from tests.conftest import DbosEnv
from tests.support import Asker, set_times, wait_until

Y2001 = 978_307_200_000  # 2001-01-01T00:00:00Z in epoch ms


def _read_back(text: str) -> int:
    """A bound as the SDK reads it (``list_workflows``'s time filters)."""
    return int(datetime.fromisoformat(text).timestamp() * 1000)


@pytest.mark.parametrize("seed", range(4))
def test_iso_at_round_trips_exactly(seed: int) -> None:
    rng = random.Random(seed)
    values = [rng.randrange(1, 2**42) for _ in range(5_000)]  # up to the year 2109
    values += [1, 999, 1000, 1001, Y2001, Y2001 + 1, Y2001 - 1, 1_700_000_000_000, 1_700_000_000_999, 2**41]
    for epoch_ms in values:
        inclusive, exclusive = iso_at(epoch_ms, inclusive=True), iso_at(epoch_ms, inclusive=False)
        assert _read_back(inclusive) == epoch_ms, (epoch_ms, inclusive)
        assert _read_back(exclusive) == epoch_ms - 1, (epoch_ms, exclusive)
        assert inclusive.endswith("+00:00")


def _workflows(count: int, name: str = "old") -> list[str]:
    ids = []
    for n in range(count):
        workflow_id = f"{name}-{n}-{uuid.uuid4()}"
        with SetWorkflowID(workflow_id):
            dbos_app.greet(name)
        ids.append(workflow_id)
    return ids


def _status(workflow_id: str) -> str | None:
    found = DBOS.get_workflow_status(workflow_id)
    return None if found is None else found.status


def _until_success(workflow_id: str) -> None:
    wait_until(lambda: _status(workflow_id) == "SUCCESS", what=f"workflow {workflow_id} finishing")


def _join_round(retention: Retention) -> None:
    thread = retention._thread
    assert thread is not None
    wait_until(lambda: not thread.is_alive(), what="the retention round ending")


def _existing(ids: list[str]) -> set[str]:
    return {w.workflow_id for w in DBOS.list_workflows(workflow_ids=ids, load_input=False, load_output=False)}


@pytest.fixture
def made(dbos_env: DbosEnv) -> Iterator[list[str]]:
    """The ids a test made: deleted at its end, so that no test's old workflows are another's."""
    ids: list[str] = []
    yield ids
    if ids:
        DBOS.delete_workflows(ids)


def _delete_every_finished_workflow() -> None:
    finished = DBOS.list_workflows(status=FINISHED, load_input=False, load_output=False)
    if finished:
        DBOS.delete_workflows([w.workflow_id for w in finished])


# -- garbage collection ------------------------------------------------------------------------------------------------


def test_the_cutoff_is_strict_to_the_millisecond(dbos_env: DbosEnv, made: list[str]) -> None:
    cutoff = Y2001 + 1_000_000
    at, before, after, long_before = _workflows(4)
    made += [at, before, after, long_before]
    for workflow_id, completed in [(at, cutoff), (before, cutoff - 1), (after, cutoff + 1),
                                   (long_before, cutoff - 500_000)]:
        set_times(dbos_env.db, workflow_id, created_at=cutoff - 600_000, completed_at=completed)
    pending = dbos_env.start_waiter()  # not finished: never collected, however old
    set_times(dbos_env.db, pending, created_at=cutoff - 600_000)
    made.append(pending)
    try:
        assert run_round(gc_cutoff_epoch_ms=cutoff, gc_rows_threshold=None, gc_batch_size=None,
                         timeout_cutoff_epoch_ms=None) == (2, 0)
        assert _existing([at, before, after, long_before, pending]) == {at, after, pending}
        assert DBOS.list_workflow_steps(before) == []  # deleted with everything it held
    finally:
        dbos_env.release(pending)
        _until_success(pending)


@pytest.mark.parametrize(("count", "batch", "batches"), [(5, 2, [2, 2, 1]), (4, 2, [2, 2]), (3, 10, [3]),
                                                         (3, None, [3]), (3, 0, [3])])
def test_deletes_run_in_batches(dbos_env: DbosEnv, made: list[str], monkeypatch: pytest.MonkeyPatch, count: int,
                                batch: int | None, batches: list[int]) -> None:
    cutoff = Y2001 + 2_000_000
    old = _workflows(count)
    recent = _workflows(1, "recent")
    made += old + recent
    for n, workflow_id in enumerate(old):
        set_times(dbos_env.db, workflow_id, created_at=cutoff - 10_000 + n, completed_at=cutoff - 5_000 + n)
    seen: list[list[str]] = []
    delete = DBOS.delete_workflows

    def spy(workflow_ids: list[str], **kwargs: Any) -> None:
        seen.append(list(workflow_ids))
        delete(workflow_ids, **kwargs)

    monkeypatch.setattr(DBOS, "delete_workflows", spy)
    assert run_round(gc_cutoff_epoch_ms=cutoff, gc_rows_threshold=None, gc_batch_size=batch,
                     timeout_cutoff_epoch_ms=None) == (count, 0)
    assert [len(ids) for ids in seen] == batches
    assert [i for ids in seen for i in ids] == old  # oldest first, each once
    assert _existing(old + recent) == set(recent)


@pytest.mark.parametrize(("count", "keep", "batch"), [(5, 2, None), (7, 3, 2), (3, 5, None), (4, 4, 1)])
def test_the_row_threshold_keeps_exactly_the_newest_finished(dbos_env: DbosEnv, made: list[str], count: int,
                                                              keep: int, batch: int | None) -> None:
    _delete_every_finished_workflow()  # the threshold counts every finished workflow of the application
    ids = _workflows(count)
    made += ids
    future = 4_102_444_800_000  # 2100: newer than any other workflow a test has finished meanwhile
    for n, workflow_id in enumerate(reversed(ids)):  # created in the order opposite to the ids': by created_at,
        set_times(dbos_env.db, workflow_id, created_at=future + n)  # ids[0] is the newest
    pending = dbos_env.start_waiter()  # not finished: neither counted nor deleted
    set_times(dbos_env.db, pending, created_at=future + count)
    made.append(pending)
    others = len(DBOS.list_workflows(status=FINISHED, load_input=False, load_output=False)) - count
    try:
        deleted, _ = run_round(gc_cutoff_epoch_ms=None, gc_rows_threshold=keep, gc_batch_size=batch,
                               timeout_cutoff_epoch_ms=None)
        assert deleted == max(0, count + others - keep)
        assert _existing(ids + [pending]) == set(ids[:keep]) | {pending}
    finally:
        dbos_env.release(pending)
        _until_success(pending)


@pytest.mark.parametrize("threshold", [0, -1])
def test_a_threshold_of_zero_or_less_is_no_rule(dbos_env: DbosEnv, made: list[str], threshold: int) -> None:
    made += _workflows(2)
    assert run_round(gc_cutoff_epoch_ms=None, gc_rows_threshold=threshold, gc_batch_size=None,
                     timeout_cutoff_epoch_ms=None) == (0, 0)
    assert _existing(made) == set(made)


# -- the global timeout ------------------------------------------------------------------------------------------------


def test_the_global_timeout_cancels_what_was_created_at_or_before_the_cutoff(dbos_env: DbosEnv,
                                                                             made: list[str]) -> None:
    cutoff = Y2001 + 4_000_000
    parked = DBOS.retrieve_queue(dbos_app.PARKED_QUEUE)
    assert parked is not None
    waiters = {name: dbos_env.start_waiter() for name in ("pending_at", "pending_before", "pending_after")}
    queued = {}
    for name in ("enqueued_at", "enqueued_after", "delayed_before"):
        with SetWorkflowID(f"{name}-{uuid.uuid4()}"), SetEnqueueOptions(
                delay_seconds=3600 if name.startswith("delayed") else None):
            queued[name] = parked.enqueue(dbos_app.greet, name).workflow_id
    [finished] = _workflows(1)
    ids = {**waiters, **queued, "finished": finished}
    made += list(ids.values())
    created = {"pending_at": cutoff, "pending_before": cutoff - 60_000, "pending_after": cutoff + 1,
               "enqueued_at": cutoff, "enqueued_after": cutoff + 1, "delayed_before": cutoff - 1,
               "finished": cutoff - 1_000}
    for name, at in created.items():
        set_times(dbos_env.db, ids[name], created_at=at)
    before = {name: _status(i) for name, i in ids.items()}
    assert before == {"pending_at": "PENDING", "pending_before": "PENDING", "pending_after": "PENDING",
                      "enqueued_at": "ENQUEUED", "enqueued_after": "ENQUEUED", "delayed_before": "DELAYED",
                      "finished": "SUCCESS"}
    try:
        assert run_round(gc_cutoff_epoch_ms=None, gc_rows_threshold=None, gc_batch_size=2,
                         timeout_cutoff_epoch_ms=cutoff) == (0, 4)
        after = {name: _status(i) for name, i in ids.items()}
        assert after == {**before, "pending_at": "CANCELLED", "pending_before": "CANCELLED",
                         "enqueued_at": "CANCELLED", "delayed_before": "CANCELLED"}
    finally:
        DBOS.cancel_workflows([ids["enqueued_after"]])
        for workflow_id in waiters.values():
            dbos_env.release(workflow_id)
        _until_success(waiters["pending_after"])


# -- the retention request ---------------------------------------------------------------------------------------------


class SlowRound:
    """Stands in for ``run_round``: records its arguments and waits for ``release``."""

    def __init__(self) -> None:
        self.calls: list[dict[str, int | None]] = []
        self.running = threading.Event()
        self.release = threading.Event()

    def __call__(self, **kwargs: int | None) -> tuple[int, int]:
        self.calls.append(kwargs)
        self.running.set()
        assert self.release.wait(10), "the test never released the round"
        return 0, 0


@pytest.fixture
def retention() -> Iterator[Retention]:
    stopping = threading.Event()
    retention = Retention(stopping=stopping)
    yield retention
    stopping.set()
    thread = retention._thread
    if thread is not None:
        thread.join(10)
        assert not thread.is_alive()


def _asker(retention: Retention) -> Asker:
    return Asker(Operations(metadata=None, on_alert=None, metadata_only=False, retention=retention).table())


def test_the_request_answers_at_once_and_a_second_one_is_skipped(retention: Retention,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    slow = SlowRound()
    monkeypatch.setattr(relay_dbos.retention, "run_round", slow)
    asker = _asker(retention)
    body = {"gc_cutoff_epoch_ms": Y2001, "gc_rows_threshold": 1000, "gc_batch_size": 50,
            "timeout_cutoff_epoch_ms": None}
    try:
        assert asker.ok("retention", body=body)["success"] is True
        assert slow.running.wait(5)
        assert not slow.release.is_set()  # answered while the round runs
        with caplog.at_level(logging.WARNING, logger="relay_dbos"):
            assert asker.ok("retention", body={**body, "gc_rows_threshold": 5})["success"] is True
        assert "Skipping retention: the previous round on this executor is still running." in caplog.messages
        assert slow.calls == [{"gc_cutoff_epoch_ms": Y2001, "gc_rows_threshold": 1000, "gc_batch_size": 50,
                               "timeout_cutoff_epoch_ms": None}]
    finally:
        slow.release.set()
    _join_round(retention)
    assert asker.ok("retention", body={"timeout_cutoff_epoch_ms": Y2001})["success"] is True  # the next one runs
    wait_until(lambda: len(slow.calls) == 2, what="the next round")
    assert slow.calls[1] == {"gc_cutoff_epoch_ms": None, "gc_rows_threshold": None, "gc_batch_size": None,
                             "timeout_cutoff_epoch_ms": Y2001}


def test_a_failed_round_is_logged_and_the_next_one_runs(retention: Retention, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int | None] = []

    def failing_round(**kwargs: int | None) -> tuple[int, int]:
        calls.append(kwargs["gc_cutoff_epoch_ms"])
        raise RuntimeError("database gone")

    monkeypatch.setattr(relay_dbos.retention, "run_round", failing_round)
    asker = _asker(retention)
    with caplog.at_level(logging.ERROR, logger="relay_dbos"):
        for cutoff in (1, 2):
            assert asker.ok("retention", body={"gc_cutoff_epoch_ms": cutoff})["success"] is True
            _join_round(retention)
    assert calls == [1, 2]
    failures = [r for r in caplog.records if r.message == "Exception encountered during enforcing retention policy"]
    assert len(failures) == 2 and all(r.exc_info for r in failures)


def test_the_request_runs_a_real_round(dbos_env: DbosEnv, retention: Retention, made: list[str]) -> None:
    cutoff = Y2001 + 5_000_000
    old, recent = _workflows(1)[0], _workflows(1, "recent")[0]
    made += [old, recent]
    set_times(dbos_env.db, old, created_at=cutoff - 2, completed_at=cutoff - 1)
    assert _asker(retention).ok("retention", body={"gc_cutoff_epoch_ms": cutoff, "gc_rows_threshold": None,
                                                   "gc_batch_size": 10, "timeout_cutoff_epoch_ms": None})["success"]
    wait_until(lambda: DBOS.get_workflow_status(old) is None, what="the old workflow's deletion")
    assert _existing([old, recent]) == {recent}
