"""When many executors of an app die together, recoveries spread across the survivors (fewest in flight first):
no survivor carries more than its fair share + 1 at a time. Survivors are protocol-level peers that answer
`recovery` slowly (so recoveries overlap) and `exist_pending_workflows` with false.

The relay here never trips the storm breaker (share 1: only all of an app at once is a storm): six of eight dying
together would trip the default one, and its pacing (a recovery every 5 s) would keep the recoveries from
overlapping at all, so that the spread would be checked on recoveries one at a time."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from websockets.sync.client import ClientConnection, connect

from tests.support import Relay, play_executor, running_relay, wait_until

pytestmark = pytest.mark.e2e
APP = "spread-e2e"
ANSWER_AFTER = 1.0


class SlowPeer:
    """A HEALTHY executor that takes ``ANSWER_AFTER`` seconds per recovery, counting what it holds at once."""

    def __init__(self, relay: Relay, executor_id: str) -> None:
        self.executor_id = executor_id
        self.in_flight = 0
        self.max_in_flight = 0
        self.recovered: list[str] = []
        self._lock = threading.Lock()
        self._stack = ExitStack()
        self._ws: ClientConnection = self._stack.enter_context(connect(f"{relay.ws_url}websocket/{APP}/{relay.key}"))
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            while True:
                request = json.loads(self._ws.recv())
                threading.Thread(target=self._answer, args=(request,), daemon=True).start()
        except Exception:
            return  # closed

    def _answer(self, request: dict[str, object]) -> None:
        reply: dict[str, object] = {"type": request["type"], "request_id": request["request_id"]}
        if request["type"] == "executor_info":
            reply.update(executor_id=self.executor_id, application_version="v1")
        elif request["type"] == "recovery":
            with self._lock:
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
            time.sleep(ANSWER_AFTER)
            with self._lock:
                self.in_flight -= 1
                self.recovered.extend(str(e) for e in request["executor_ids"])  # type: ignore[attr-defined]
            reply.update(success=True)
        elif request["type"] == "exist_pending_workflows":
            reply.update(exist=False)
        else:
            reply.update(error_message="Unknown message type")
        self._ws.send(json.dumps(reply))

    def close(self) -> None:
        self._stack.close()


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    with running_relay(tmp_path_factory.mktemp("relay-spread"), RELAY_RECOVERY_STORM_SHARE="1") as started:
        yield started


@pytest.fixture
def peers(relay: Relay) -> Iterator[list[SlowPeer]]:
    with relay.api() as api:
        api.put(f"/v2/orgs/local/apps/{APP}")
        api.patch(f"/v2/orgs/local/apps/{APP}", json={"executorTimeoutSecs": 1})
    survivors = [SlowPeer(relay, f"survivor-{i}") for i in range(2)]
    try:
        yield survivors
    finally:
        for peer in survivors:
            peer.close()


def test_recoveries_are_spread_across_survivors(relay: Relay, peers: list[SlowPeer]) -> None:
    dead = [f"doomed-{i}" for i in range(6)]
    wait_until(lambda: all(relay.executors(APP).get(p.executor_id) == "HEALTHY" for p in peers), timeout=10,
               what="survivors HEALTHY")
    with ExitStack() as stack:
        for executor_id in dead:
            stack.enter_context(play_executor(relay, APP, executor_id))
        wait_until(lambda: sum(s == "HEALTHY" for s in relay.executors(APP).values()) == 8, timeout=15,
                   what="all HEALTHY")
    # All six closed at once: they die together after the 1 s grace.
    wait_until(lambda: set(relay.executors(APP)) == {p.executor_id for p in peers}, timeout=30,
               what="every dead record deleted after its recovery")
    assert sorted(e for p in peers for e in p.recovered) == dead  # each recovered once, by exactly one peer
    fair_share = len(dead) // len(peers)
    assert all(p.max_in_flight <= fair_share + 1 for p in peers), [p.max_in_flight for p in peers]
    assert all(p.recovered for p in peers)
    ops = [op for op, ex in relay.audit(APP) if ex in dead]
    assert ops.count("executor.recovery.succeeded") == 6 and ops.count("executor.deleted") == 6
    assert "executor.recovery.held" not in ops  # not paced: the recoveries overlapped
    assert max(p.max_in_flight for p in peers) > 1, [p.max_in_flight for p in peers]
