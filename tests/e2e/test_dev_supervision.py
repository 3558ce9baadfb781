"""`relay dev` supervises its embedded Temporal: a dev server that dies is started again on the same port and data
file (also while its port is still taken), Relay works again end to end, the outage costs a bounded number of log
lines, and a normal stop leaves no Temporal behind. The SDK log throttle, fed records:
tests/unit/test_sdk_log_throttle.py."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import RawPeer, Relay, relay_env, start_relay, wait_recorded, wait_until

APP = "supervised"


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found |= {int(p) for p in (task / "children").read_text().split()}
    return found


def _temporal_child(relay: Relay) -> int | None:
    for pid in _children(relay.process.pid):
        with contextlib.suppress(OSError):
            if "start-dev" in Path(f"/proc/{pid}/cmdline").read_text():
                return pid
    return None


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(cols[9])
    return inodes


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the listening socket on ``port`` (from /proc: no psutil)."""
    wanted = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(fd) in wanted:
                return True
    return False


def _new_temporal_on(relay: Relay, port: int, old: set[int]) -> int:
    found: list[int] = []

    def serving() -> bool:
        pid = _temporal_child(relay)
        if pid is None or pid in old or not _listens(pid, port):
            return False
        found.append(pid)
        return True

    wait_until(serving, timeout=40, interval=0.1, what=f"a new temporal child listening on {port}")
    return found[-1]


@contextlib.contextmanager
def _holding(port: int) -> Iterator[None]:
    """Take the port the moment it is free and keep it, as a process that has not quite died does."""
    held: list[socket.socket] = []

    def take() -> bool:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the dead server's connections in TIME_WAIT
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen(1)
        except OSError:
            sock.close()
            return False
        held.append(sock)
        return True

    wait_until(take, timeout=5, interval=0.005, what=f"port {port} free to hold")
    try:
        yield
    finally:
        held[0].close()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _processes_using(path: Path) -> list[int]:
    """Every process whose command line names ``path`` (a dev server on this test's data file)."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if str(path) in proc.joinpath("cmdline").read_text() and _alive(int(proc.name)):
                pids.append(int(proc.name))
    return pids


def _outage_lines(log: str) -> list[str]:
    """Relay's own lines, without those the test's requests cause (access log, socket open/accepted/closed)."""
    own = ('HTTP/1.1"', "connection open", "connection closed", '"WebSocket /websocket/')
    return [line for line in log.splitlines() if line.strip() and not any(s in line for s in own)]


def _env(tmp_path: Path) -> dict[str, str]:
    # The gateway watch's timeout (and the fence, which defaults to it) well beyond the outage: this file tests the
    # supervisor and the logs, not what Relay decides about executors when Temporal is away.
    return relay_env(tmp_path, RELAY_GATEWAY_HEARTBEAT_TIMEOUT_SECS="60")


@pytest.mark.e2e
def test_killed_temporal_comes_back_on_its_port_and_relay_works_again(tmp_path: Path) -> None:
    env = _env(tmp_path)
    port = int(env["RELAY_TEMPORAL_PORT"])
    relay = start_relay(tmp_path, env)
    peers: list[RawPeer] = []
    seen: set[int] = set()
    try:
        first = _temporal_child(relay)
        assert first is not None and _listens(first, port)
        seen.add(first)
        peers.append(RawPeer(relay.ws_url, APP, relay.key, "before"))
        wait_until(lambda: relay.executors(APP).get("before") == "HEALTHY", timeout=20, what="before HEALTHY")
        wait_recorded(relay.temporal_address, APP, "before")

        mark = len(relay.process.output())
        os.kill(first, signal.SIGKILL)
        # The port stays taken for a while: the first starts fail, and the supervisor keeps trying, waiting 0.5 s,
        # 1 s, 2 s, then 4 s: an outage of about 10 s.
        with _holding(port):
            wait_until(lambda: relay.process.output()[mark:].count("address already in use") >= 3, timeout=20,
                       what="three failed starts")
        second = _new_temporal_on(relay, port, seen)
        seen.add(second)

        peers.append(RawPeer(relay.ws_url, APP, relay.key, "after"))
        wait_until(lambda: relay.executors(APP).get("after") == "HEALTHY", timeout=30, what="after HEALTHY")
        wait_recorded(relay.temporal_address, APP, "before", timeout=30)  # still HEALTHY in its workflow
        assert relay.executors(APP) == {"before": "HEALTHY", "after": "HEALTHY"}

        lines = _outage_lines(relay.process.output()[mark:])
        report = "\n".join(lines)
        assert len(lines) < 20, report
        assert report.count("Traceback") <= 1 and "\x1b[" not in report, report  # no traceback spam, no Core colours
        supervisor = [line for line in lines if " relay.dev: " in line]
        assert sum("was killed by SIGKILL" in line for line in supervisor) == 1, report
        assert sum("address already in use" in line for line in supervisor) >= 2, report
        assert sum("serves again" in line for line in supervisor) == 1, report
        assert sum(" temporalio" in line for line in lines) <= 5, report  # one per kind per minute
    finally:
        for peer in peers:
            peer.stop()
        code = relay.process.stop()
        for pid in seen:  # before any assertion, so a failed stop leaves no Temporal behind
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        assert code == 0, relay.process.output()[-3000:]


@pytest.mark.concurrent  # outcomes only, generous waits: two at a time
@pytest.mark.e2e
def test_normal_stop_restarts_nothing_and_leaves_no_temporal(tmp_path: Path) -> None:
    env = _env(tmp_path)
    port = int(env["RELAY_TEMPORAL_PORT"])
    relay = start_relay(tmp_path, env)
    seen: set[int] = set()
    try:
        first = _temporal_child(relay)
        assert first is not None
        seen.add(first)
        os.kill(first, signal.SIGKILL)
        seen.add(_new_temporal_on(relay, port, seen))
        wait_until(lambda: "serves again" in relay.process.output(), timeout=20, what="the restart logged")

        mark = len(relay.process.output())
        relay.process.popen.send_signal(signal.SIGINT)  # Ctrl-C
        assert relay.process.popen.wait(30) == 0, relay.process.output()[-3000:]
        assert not [pid for pid in seen if _alive(pid)], "temporal left behind"
        assert _processes_using(tmp_path / "temporal.db") == []
        assert "starting it again" not in relay.process.output()[mark:]
    finally:
        relay.process.stop()
        for pid in seen:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.concurrent  # outcomes only, generous waits: two at a time
@pytest.mark.e2e
def test_a_restarted_temporal_dies_with_a_killed_relay_dev(tmp_path: Path) -> None:
    env = _env(tmp_path)
    relay = start_relay(tmp_path, env)
    seen: set[int] = set()
    try:
        first = _temporal_child(relay)
        assert first is not None
        seen.add(first)
        os.kill(first, signal.SIGKILL)
        second = _new_temporal_on(relay, int(env["RELAY_TEMPORAL_PORT"]), seen)
        seen.add(second)
        relay.process.kill()  # no chance to stop its child: the kernel's parent-death signal must
        wait_until(lambda: not _alive(second), timeout=20, what="the restarted temporal gone with its parent")
        assert _processes_using(tmp_path / "temporal.db") == []
    finally:
        relay.process.stop()
        for pid in seen:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
