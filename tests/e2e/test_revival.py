"""An executor that comes back while its recovery waits is not recovered.

A red team froze gateway A (SIGSTOP) with executor x1 on it, had a load balancer keep x1 away until it was DEAD,
then let it reconnect through gateway B while Relay was on its recovery path: the recovery request went out anyway
and a step of x1's workflow ran again on a second process. The rule: a ``connected`` from a newer connection that
lands before ``dispatch_recovery`` is scheduled calls the recovery off (``executor.recovery.cancelled``), whatever
the workflow was waiting on. Here the wait is made deterministic inside the recovery path itself:

- an operator's recovery pause holds the DEAD executor at the gate (``executor.recovery.held``), with real
  ``dbos==3.2.0`` executors: x1 running a workflow, x2 its peer of the same version;
- no HEALTHY peer of its version holds it (``executor.recovery.blocked``), with protocol-level peers.

Where the candidate sits matters. A gateway refuses to deliver ``recovery`` for an executor connected to it
(``gateway/activities.py``, ``ExecutorAlive``), so with the candidate on B, where x1 came back, a request sent by
mistake is stopped there and shows only in the audit (``executor.recovery.dispatched``, then ``failed``). With the
candidate on a third gateway C only the workflow's rule stands between x1 and a second process running its steps,
as in the red team's run: there a mistake also shows as steps run by x2.

Real processes: a Temporal dev server, `relay worker`, gateways A, B and C (``tests.e2e.test_outages.Cluster``,
with its short timings), and a stand-in load balancer in front of x1 that the test steers. Each test prints its
timeline, in seconds from A's freeze.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter

import pytest

from tests.e2e.test_outages import (  # noqa: F401 — the fixtures
    PAUSE_RECHECK_SECS,
    Cluster,
    Gateway,
    cluster,
    peers,
    proxies,
)
from tests.faults import (
    Cut,
    LoadBalancer,
    Observed,
    RegistryRow,
    TcpProxy,
    frozen,
    registry_rows,
    report,
    violations,
)
from tests.sdk import SystemDatabase, steps_by_pid
from tests.support import AuditRow, Process, RawPeer, audit_rows, dbos_executor, wait_recorded, wait_until

pytestmark = pytest.mark.e2e

ORG_APPS = "/v2/orgs/local/apps"
WORKFLOW = "wf-x1"
STEPS = 20  # tests/executor_app.py's twenty_steps
# 20 steps of 2.5 s (up to 50 s): x1's workflow runs from before the freeze until well after the pause is lifted
# (at the latest DEAD + CANCELLED_WITHIN, about 20 s after the freeze) and the held recovery has looked at the gate
# again twice (every RELAY_RECOVERY_PAUSE_RECHECK_SECS, 3 s here): a recovery sent for x1 by mistake then has x2 run
# the steps x1 has not finished yet, as in the red team's run. Then the test lets the rest run fast.
STEP_SECONDS = 2.5
LOOKS_AFTER_THE_LIFT = 2 * PAUSE_RECHECK_SECS + 1.0
# The watch's heartbeat timeout and its probe's pick-up (2 x 2 s), the grace (3 s), at most a probe before DEAD
# (2 s; none once A is known gone), Temporal's timers a second late: DEAD 6 to 12 s after the freeze. Room for a
# loaded 2-core machine.
DEAD_WITHIN = 45.0
CANCELLED_WITHIN = 10.0  # from the reconnect: the wait in the recovery path wakes on the `connected` signal


def _steered(started: list[TcpProxy], a: Gateway, b: Gateway) -> LoadBalancer:
    """x1's way in: to A only, until the test says otherwise."""
    lb = LoadBalancer(a.port, b.port, name="x1-lb")
    started.append(lb)  # the proxies fixture closes it after the cluster stops
    lb.mark_down(1)
    return lb


def _let_through_to_b(lb: LoadBalancer) -> None:
    """A stays down (it is frozen, its health check fails); B takes x1's next attempt."""
    lb.mark_down(0)
    lb.mark_up(1)
    lb.restore()  # after the marks: the proxy's loop runs them in order


def _start_dbos(run: Cluster, app: str, name: str, ws_url: str, started: list[Process],
                **extra: str) -> tuple[Process, str]:
    """A real executor; its id (the SDK makes one up at each launch under a conductor) read from the registry once
    it is HEALTHY. One at a time: two executors migrating a new SQLite system database at once can crash one."""
    known = set(registry_rows(run.tmp, app))
    process = dbos_executor(ws_url, run.key, app, run.tmp / "sys.sqlite", run.tmp / f"dbos-{name}.log",
                            STEP_LOG=str(run.tmp / "steps"), **extra)
    started.append(process)
    wait_until(lambda: set(registry_rows(run.tmp, app)) - known, timeout=60, what=f"{name} connected")
    [executor_id] = set(registry_rows(run.tmp, app)) - known
    run.wait_healthy(app, executor_id)
    return process, executor_id


def _ops(run: Cluster, app: str, executor_id: str) -> list[str]:
    return [r.operation for r in audit_rows(run.tmp, app, executor_id)]


def _dead_and(run: Cluster, app: str, executor_id: str, operation: str) -> bool:
    """DEAD in the registry, and its recovery waiting with ``operation`` written."""
    row = registry_rows(run.tmp, app).get(executor_id)
    return row is not None and row.status == "DEAD" and operation in _ops(run, app, executor_id)


def _timeline(title: str, frozen_at: float, rows: list[AuditRow], marks: dict[str, float]) -> str:
    """x1's audit rows since the freeze and the test's own moments, in seconds from the freeze."""
    events = [(r.emit_time, r.operation) for r in rows if r.emit_time >= frozen_at - 1]
    events += [(at, f"[test] {what}") for what, at in marks.items()]
    return "\n".join([f"{title} (s from A's freeze):",
                      *(f"  {at - frozen_at:7.2f}  {what}" for at, what in sorted(events))])


def _rules_broken(observed: Observed, revived: str, *, timeout: float) -> str | None:
    """None once the run keeps every rule of ``tests.faults``, else its report (at once on a safety violation).

    ``revived`` counts among those that stayed, its ``executor.dead`` left out: it was kept away past its grace on
    purpose, so DEAD was right; recovered, deleted or named in a recovery request is not.
    """
    found: list[str] = []

    def settled() -> bool:
        run = observed.collect()
        run.audit = [r for r in run.audit if (r.executor_id, r.operation) != (revived, "executor.dead")]
        broken = violations(run)
        found[:] = [report(run, broken)] if broken else []
        return not broken or any(v.safety for v in broken)

    with contextlib.suppress(AssertionError):
        wait_until(settled, timeout=timeout, interval=0.5, what="the run to keep the rules")
    return found[0] if found else None


def _pause(gateway: Gateway, app: str) -> None:
    with gateway.relay.api() as api:
        response = api.put(f"{ORG_APPS}/{app}/recovery-pause",
                           json={"expiresInSecs": 600, "reason": "hold x1's recovery while it comes back"})
    assert response.status_code == 200, response.text


def _lift_pause(gateway: Gateway, app: str) -> None:
    with gateway.relay.api() as api:
        response = api.delete(f"{ORG_APPS}/{app}/recovery-pause")
    assert response.status_code == 204, response.text


def _gate_waiting(gateway: Gateway, app: str) -> list[str]:
    """The recoveries the app's gate lists as not let through yet."""
    with gateway.relay.api() as api:
        response = api.get(f"{ORG_APPS}/{app}/recovery")
    response.raise_for_status()
    return [str(w["executorId"]) for w in response.json()["waiting"]]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_back_through_another_gateway_while_its_recovery_is_paused(
    proxies: list[TcpProxy], cluster: Cluster  # noqa: F811 — the fixtures
) -> None:
    """Gateway A frozen with x1 (a real executor, mid-workflow) on it; x1 kept away until DEAD and its recovery
    held by an operator's pause; x1 back through B while held. The recovery is called off before any request goes
    out: x2 (the candidate) is never asked, x1 ends HEALTHY on B, and its workflow runs once, on x1 alone.

    x2 is on a third gateway, C: on B, B itself would refuse a mistaken request for x1 (it holds x1's socket), and
    only the audit would show the mistake; on C only the workflow's own look stands in the way, as in the red
    team's run (where a step ran on two processes)."""
    a, b, app = cluster.start_gateway("gateway-a"), cluster.start_gateway("gateway-b"), "revival"
    home = cluster.start_gateway("gateway-c")
    cluster.register(b, app)
    lb = _steered(proxies, a, b)
    go, fast, steps = cluster.tmp / "go", cluster.tmp / "fast", cluster.tmp / "steps"
    executors: list[Process] = []
    findings: list[str] = []
    try:
        x1, x1_id = _start_dbos(cluster, app, "x1", lb.ws_url, executors, START_WORKFLOW=WORKFLOW,
                                START_WORKFLOW_WHEN=str(go), STEP_SECONDS=str(STEP_SECONDS),
                                STEPS_FAST_WHEN=str(fast))
        x2, x2_id = _start_dbos(cluster, app, "x2", home.relay.ws_url, executors)
        placed = registry_rows(cluster.tmp, app)
        assert (placed[x1_id].gateway_queue, placed[x2_id].gateway_queue) == (a.queue, home.queue), placed
        go.touch()
        wait_until(lambda: x1.pid in steps_by_pid(steps), timeout=30, what="x1's workflow running")
        _pause(b, app)
        observed = Observed(cluster.tmp, app, cluster.temporal_address, stayed={x1_id, x2_id}, left=(),
                            live_gateway_queues={b.queue, home.queue})

        with frozen(a.relay.process.pid, group=True):
            frozen_at = time.time()
            lb.cut(Cut.RESET)  # x1's socket reset (A, frozen, cannot tell anyone); every new attempt refused
            marks = {"A frozen, x1 refused everywhere": frozen_at}
            try:
                wait_until(lambda: _dead_and(cluster, app, x1_id, "executor.recovery.held"), timeout=DEAD_WITHIN,
                           what="x1 DEAD and its recovery held by the pause")
            except AssertionError as err:
                raise AssertionError(f"{err}\n{report(observed.collect(), [])}") from None
            marks["x1 let through to B"] = time.time()
            _let_through_to_b(lb)
            wait_until(lambda: lb.per_backend[1] >= 1, timeout=15, what="x1's connection forwarded to B")
            marks["x1's connection reaches B"] = time.time()
            try:
                wait_until(lambda: "executor.recovery.cancelled" in _ops(cluster, app, x1_id),
                           timeout=CANCELLED_WITHIN, what="x1's recovery called off while held")
            except AssertionError as err:
                findings.append(f"{err}: the gate's wait did not end on x1's `connected`")
            _lift_pause(b, app)
            marks["pause lifted"] = time.time()
            time.sleep(LOOKS_AFTER_THE_LIFT)  # the held recovery's looks at the gate, with x1's workflow running
            broken = _rules_broken(observed, x1_id, timeout=30)
            if broken:
                findings.append(f"x1 and x2 not both HEALTHY, unrecovered, within 30 s of the lift:\n{broken}")
            fast.touch()
            marks["steps let run fast"] = time.time()
            try:
                wait_until(lambda: SystemDatabase(path=cluster.tmp / "sys.sqlite").status(WORKFLOW) == "SUCCESS",
                           timeout=STEPS * STEP_SECONDS + 30, what=f"{WORKFLOW} SUCCESS")
            except AssertionError as err:
                findings.append(str(err))
            rows = audit_rows(cluster.tmp, app, x1_id)
            waiting = _gate_waiting(b, app)
        print("\n" + _timeline("x1, held by a pause", frozen_at, rows, marks))
        if waiting:
            findings.append(f"the gate still lists held recoveries after the cancel (GET .../recovery): {waiting}")

        dispatched = [r for r in audit_rows(cluster.tmp, app) if r.operation == "executor.recovery.dispatched"]
        if dispatched:
            findings.append(f"recovery dispatched: {[(r.executor_id, r.details) for r in dispatched]}")
        if f"for executor {x1_id}" in x2.output():  # dbos logs "Recovering N workflows for executor X" per request
            findings.append("x2 got a recovery request for x1 (its DBOS log says so)")
        if "executor.recovery.cancelled" not in [r.operation for r in rows]:
            findings.append("no executor.recovery.cancelled row for x1")
        if "executor.deleted" in [r.operation for r in rows]:
            findings.append("x1's record was deleted")
        if registry_rows(cluster.tmp, app).get(x1_id) != RegistryRow("HEALTHY", b.queue):
            findings.append(f"x1 at the end: {registry_rows(cluster.tmp, app).get(x1_id)}, not HEALTHY on B")
        ran = steps_by_pid(steps)
        by_step = Counter(s for done in ran.values() for s in done)
        if set(ran) != {x1.pid} or by_step != Counter(range(STEPS)):
            findings.append(f"steps by pid (x1 {x1.pid}, x2 {x2.pid}): {ran}; each step once, by x1 alone")
        owner = SystemDatabase(path=cluster.tmp / "sys.sqlite").query(
            "SELECT executor_id FROM workflow_status WHERE workflow_uuid = ?", WORKFLOW)
        if owner != [(x1_id,)]:
            findings.append(f"{WORKFLOW}'s executor in DBOS: {owner}, not x1 ({x1_id})")
    finally:
        for process in executors:
            process.stop()
    assert not findings, "\n\n".join(findings)


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_back_through_another_gateway_while_blocked_for_a_peer(
    proxies: list[TcpProxy], cluster: Cluster, peers: list[RawPeer]  # noqa: F811 — the fixtures
) -> None:
    """The same freeze of A, x1 a protocol-level peer; its recovery blocked: the only HEALTHY executor of the app
    is of another version. x1 back through B calls the recovery off; a peer of its version connecting afterwards
    is sent nothing. The peers are on C, which would deliver a request for x1 (B would refuse it)."""
    a, b, app, key = cluster.start_gateway("gateway-a"), cluster.start_gateway("gateway-b"), "blocked", cluster.key
    c = cluster.start_gateway("gateway-c")
    cluster.register(b, app)
    lb = _steered(proxies, a, b)
    x1 = RawPeer(lb.ws_url, app, key, "x1")
    peers.append(x1)
    cluster.wait_healthy(app, "x1")
    other = RawPeer(c.relay.ws_url, app, key, "other-version", version="v2")
    peers.append(other)
    cluster.wait_healthy(app, "other-version")
    assert registry_rows(cluster.tmp, app)["x1"] == RegistryRow("HEALTHY", a.queue)
    findings: list[str] = []

    with frozen(a.relay.process.pid, group=True):
        frozen_at = time.time()
        lb.cut(Cut.RESET)
        marks = {"A frozen, x1 refused everywhere": frozen_at}
        observed = Observed(cluster.tmp, app, cluster.temporal_address, stayed={"x1", "other-version"}, left=(),
                            peers=peers, live_gateway_queues={b.queue, c.queue})
        try:
            wait_until(lambda: _dead_and(cluster, app, "x1", "executor.recovery.blocked"), timeout=DEAD_WITHIN,
                       what="x1 DEAD and its recovery blocked for want of a v1 peer")
        except AssertionError as err:
            raise AssertionError(f"{err}\n{report(observed.collect(), [])}") from None
        handshakes = x1.handshakes
        marks["x1 let through to B"] = time.time()
        _let_through_to_b(lb)
        wait_until(lambda: x1.handshakes > handshakes, timeout=15, what="x1's handshake on B")
        marks["x1's handshake on B"] = time.time()
        try:
            wait_until(lambda: "executor.recovery.cancelled" in _ops(cluster, app, "x1"), timeout=CANCELLED_WITHIN,
                       what="x1's recovery called off while blocked")
        except AssertionError as err:
            findings.append(f"{err}: the wait for a peer did not end on x1's `connected`")
        x2 = RawPeer(c.relay.ws_url, app, key, "x2")
        peers.append(x2)
        marks["x2 (v1) connecting to C"] = time.time()
        cluster.wait_healthy(app, "x2")
        try:  # its recovery ended, one way or the other, and it is recorded HEALTHY again
            wait_recorded(cluster.temporal_address, app, "x1", timeout=15)
        except AssertionError as err:
            findings.append(str(err))
        observed.stayed = {"x1", "other-version", "x2"}
        broken = _rules_broken(observed, "x1", timeout=30)
        if broken:
            findings.append(f"the run breaks the rules:\n{broken}")
        rows = audit_rows(cluster.tmp, app, "x1")
    print("\n" + _timeline("x1, blocked for want of a peer", frozen_at, rows, marks))

    operations = [r.operation for r in rows]
    if "executor.recovery.cancelled" not in operations or "executor.recovery.dispatched" in operations:
        findings.append(f"x1's recovery not called off before any request: {operations}")
    # Relay's own alerts about x1 (RecoveryBlocked, then RecoveryUnblocked when called off) go to one HEALTHY
    # executor of the app as they happen: an ``alert`` message is no request about x1's recovery.
    sent = {p.executor_id: [r["type"] for r in p.requests if r["type"] != "alert"] for p in (x2, other)}
    if any(sent.values()):
        findings.append(f"requests sent to the peers: {sent}")
    if registry_rows(cluster.tmp, app).get("x1") != RegistryRow("HEALTHY", b.queue):
        findings.append(f"x1 at the end: {registry_rows(cluster.tmp, app).get('x1')}, not HEALTHY on B")
    assert not findings, "\n\n".join(findings)
