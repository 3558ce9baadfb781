"""`rest`: REST getApp throughput on Relay's gateway against the smallest FastAPI + SQLModel app doing the same key
check and app read (``tests.bench.baseline_rest``), both on uvicorn with h11 and the asyncio loop, on the same SQLite
database (the stack's ``relay.db``).

One Relay stack (embedded Temporal, `relay worker`, `relay gateway`) and the baseline server beside it. The load
client is a process of its own (``--client``: raw asyncio HTTP/1.1, so it costs little of the 2 cores it shares with
the server): ``CONNECTIONS`` (50) keep-alive connections each sending GET ``/v2/orgs/local/apps/{app}`` with a Bearer
key back to back, ``WARMUP_S`` (2 s) of warm-up, then a ``REST_SECONDS`` (10 s; 5 s at ``BENCH_SCALE`` < 0.5) window:
requests completed per second, their latency p50/p99, and the server process's CPU (utime+stime from ``/proc``) per
request over the window, gross (its idle work included). The windows alternate (baseline, Relay, baseline, Relay) so
a change in the machine's load lands on both. Target: Relay ≥ 0.9× the baseline's requests per second.

    python -m tests.bench rest
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from tests.bench.common import (
    ORG,
    PYTHON,
    ROOT,
    SCALE,
    Proc,
    Results,
    cpu_seconds,
    log,
    percentile,
    start_stack,
)
from tests.support import free_port, wait_until

APP = "rest-bench"
CONNECTIONS = 50
WARMUP_S = 2.0
SECONDS = float(os.environ.get("REST_SECONDS", "10" if SCALE >= 0.5 else "5"))
ROUNDS = 2
MIN_RATIO = 0.9


# -- the load client (its own process) ---------------------------------------------------------------------


@dataclass
class Window:
    """What the connections completed inside the measurement window ``[start, end)`` (loop clock)."""

    start: float
    end: float
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)

    def record(self, status: int, began: float, done: float) -> None:
        if self.start <= done < self.end:
            self.statuses[status] = self.statuses.get(status, 0) + 1
            if status == 200:
                self.latencies.append(done - began)


async def _connection(host: str, port: int, request: bytes, window: Window) -> None:
    """One keep-alive connection sending ``request`` back to back until the window ends."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while loop.time() < window.end:
            began = loop.time()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            at = head.lower().find(b"content-length:")
            if at < 0:
                raise ConnectionError(f"no content-length in {head[:200]!r}")
            length = int(head[at + 15:head.index(b"\r\n", at)])
            await reader.readexactly(length)
            window.record(int(head[9:12]), began, loop.time())
    finally:
        writer.close()


async def load(url: str, key: str, *, connections: int, warmup: float, seconds: float) -> dict[str, Any]:
    """Hammer ``url`` (GET) over ``connections`` keep-alive connections; prints ``measuring`` when the window
    opens and ``done`` when it closes (the bench reads the server's CPU at each), then returns the figures."""
    loop = asyncio.get_running_loop()
    parsed = urllib.parse.urlsplit(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    request = (f"GET {parsed.path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
               f"Accept: application/json\r\n\r\n").encode()
    start = loop.time() + warmup
    window = Window(start, start + seconds)
    tasks = [asyncio.create_task(_connection(host, port, request, window)) for _ in range(connections)]

    async def mark(at: float, word: str) -> float:
        await asyncio.sleep(max(0.0, at - loop.time()))
        print(word, flush=True)
        return time.process_time()

    cpu0 = await mark(window.start, "measuring")
    cpu1 = await mark(window.end, "done")
    await asyncio.gather(*tasks)
    done = sum(window.statuses.values())
    return {"requests": done, "per_s": done / seconds, "statuses": window.statuses,
            "p50_ms": percentile(window.latencies, 50) * 1000, "p99_ms": percentile(window.latencies, 99) * 1000,
            "client_cpu_share": (cpu1 - cpu0) / seconds}


# -- the bench ---------------------------------------------------------------------------------------------


def _expect(stream: IO[str], word: str) -> None:
    line = stream.readline().strip()
    if line != word:
        raise RuntimeError(f"REST load client: expected {word!r}, got {line!r}")


def _measure(kind: str, pid: int, url: str, key: str, logdir: Path) -> dict[str, Any]:
    """One window of the load client against the server ``pid`` serving ``url``; the server's CPU around it."""
    cmd = [PYTHON, "-m", "tests.bench.bench_rest", "--client", url, str(CONNECTIONS), str(WARMUP_S), str(SECONDS)]
    with open(logdir / f"rest-client-{kind}.log", "ab") as err:
        client = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "REST_KEY": key}, stdout=subprocess.PIPE,
                                  stderr=err, text=True, start_new_session=True)
    try:
        assert client.stdout is not None
        _expect(client.stdout, "measuring")
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        _expect(client.stdout, "done")
        cpu, wall = cpu_seconds(pid) - cpu0, time.monotonic() - t0
        out: dict[str, Any] = json.loads(client.stdout.readline())
        client.wait(30)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    out.update(server_cpu_s=cpu, wall_s=wall, cpu_ms_per_request=cpu / max(1, out["requests"]) * 1000,
               server_cores=cpu / wall)
    bad = {s: n for s, n in out["statuses"].items() if s != "200"}
    log(f"  {kind}: {out['per_s']:.0f} req/s, p50 {out['p50_ms']:.1f} ms, p99 {out['p99_ms']:.1f} ms, "
        f"server CPU {out['cpu_ms_per_request']:.2f} ms/request ({out['server_cores']:.2f} cores), "
        f"client {out['client_cpu_share']:.2f} cores" + (f"; non-200: {bad}" if bad else ""))
    if bad:
        raise AssertionError(f"{kind}: non-200 answers {bad}")
    return out


def _pooled(windows: list[dict[str, Any]]) -> dict[str, float]:
    """The windows of one server together: requests per second and CPU per request over all of them; latencies
    as the mean of the windows' percentiles."""
    requests = sum(w["requests"] for w in windows)
    return {"per_s": requests / (SECONDS * len(windows)),
            "cpu_ms": sum(w["server_cpu_s"] for w in windows) / requests * 1000,
            "p50_ms": sum(w["p50_ms"] for w in windows) / len(windows),
            "p99_ms": sum(w["p99_ms"] for w in windows) / len(windows)}


def run(results: Results) -> None:
    log(f"rest: getApp over {CONNECTIONS} keep-alive connections, {ROUNDS} windows of {SECONDS:g} s per server")
    stack = start_stack("rest")
    try:
        stack.put_app(APP)
        port = free_port()
        db_url = f"sqlite:///{stack.data_dir / 'relay.db'}"
        baseline = Proc("baseline-rest", [PYTHON, "-m", "tests.bench.baseline_rest", str(port), db_url],
                        env=stack.env, logdir=stack.data_dir)
        stack.extra.append(baseline)
        path = f"/v2/orgs/{ORG}/apps/{APP}"
        servers = {"baseline": (baseline.pid, f"http://127.0.0.1:{port}{path}"),
                   "relay": (stack.gateway.pid, f"{stack.url}{path}")}
        headers = {"Authorization": f"Bearer {stack.key}"}

        def answers(url: str) -> bool:
            try:
                return httpx.get(url, headers=headers, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(lambda: answers(servers["baseline"][1]), timeout=30, what="the baseline REST app")
        bodies = {kind: httpx.get(url, headers=headers).json() for kind, (_, url) in servers.items()}
        if set(bodies["baseline"]) != set(bodies["relay"]):
            raise AssertionError(f"the baseline's getApp differs from Relay's: {bodies}")
        windows: dict[str, list[dict[str, Any]]] = {kind: [] for kind in servers}
        for round_ in range(1, ROUNDS + 1):
            for kind, (pid, url) in servers.items():
                log(f"rest round {round_}: {kind}")
                windows[kind].append(_measure(kind, pid, url, stack.key, stack.data_dir))
    finally:
        stack.stop()
    relay, base = _pooled(windows["relay"]), _pooled(windows["baseline"])
    results.details["rest"] = {"windows": windows, "relay": relay, "baseline": base}
    results.compare("rest", f"getApp req/s, {CONNECTIONS} keep-alive connections (vs FastAPI+SQLModel)",
                    relay["per_s"], base["per_s"], "/s", min_ratio=MIN_RATIO,
                    note=f"{ROUNDS} windows of {SECONDS:g} s each, alternating; both on uvicorn h11 + asyncio, "
                         "same SQLite database; the baseline reads the key and the app row, Relay also the executors")
    results.compare("rest", "getApp latency p50", round(relay["p50_ms"], 2), round(base["p50_ms"], 2), "ms")
    results.compare("rest", "getApp latency p99", round(relay["p99_ms"], 2), round(base["p99_ms"], 2), "ms")
    results.compare("rest", "server CPU per getApp (gross)", round(relay["cpu_ms"], 3), round(base["cpu_ms"], 3),
                    "ms", note="utime+stime of the server process over the windows / requests completed")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--client"]:
        url, connections, warmup, seconds = argv[1], int(argv[2]), float(argv[3]), float(argv[4])
        figures = asyncio.run(load(url, os.environ["REST_KEY"], connections=connections, warmup=warmup,
                                   seconds=seconds))
        print(json.dumps(figures), flush=True)
        return 0
    from tests.bench.__main__ import main as bench

    return bench(["rest"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
