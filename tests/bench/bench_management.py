"""P8 (workflow management latency) and P9 (concurrent management with a recovery meanwhile), on one Relay stack
(embedded Temporal, `relay worker`, `relay gateway`) and a real `dbos==3.2.0` executor with 100 finished workflows.

- P8: listWorkflows (limit 100, no inputs or outputs) through Relay's REST API, against the same request sent
  straight to an executor's conductor socket by a bare websockets server (``_Direct``: no Relay, no HTTP) —
  added latency p50/p99, target ≤ 5 ms added at p50 on the executor's own gateway; then the same call routed
  through a second gateway process (the executor connected to it), reported.
- P9: 50 concurrent listWorkflows on the app (throughput), while a fake executor of the same app drops: its
  recovery goes to the real executor, busy with those queries. DEAD → recovery succeeded, against P5's 1 s.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
import urllib.parse
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
from websockets.asyncio.server import ServerConnection, serve

from tests.bench.common import (
    EXECUTOR_APP,
    ORG,
    PYTHON,
    RELAY,
    Generator,
    Proc,
    Results,
    Stack,
    log,
    percentile,
    scaled,
    start_stack,
)
from tests.support import VENV_BIN, free_port, wait_until

APP = "mgmt-bench"
WORKFLOWS = 100
LIST_BODY = {"limit": WORKFLOWS, "load_input": False, "load_output": False, "sort_desc": True}
P9_GRACE = 2


class _Direct:
    """A bare conductor: holds one executor socket and sends it ``list_workflows``, timing each reply."""

    def __init__(self) -> None:
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.ws: ServerConnection | None = None
        self.ready = threading.Event()
        self.replies: dict[str, asyncio.Future[str]] = {}
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result(10)

    async def _serve(self) -> None:
        self.server = await serve(self._handler, "127.0.0.1", self.port, max_size=None, compression=None)

    async def _handler(self, ws: ServerConnection) -> None:
        await ws.send(json.dumps({"type": "executor_info", "request_id": "info"}))
        await ws.recv()
        self.ws = ws
        self.ready.set()
        async for frame in ws:
            message = json.loads(frame)
            future = self.replies.pop(message.get("request_id"), None)
            if future is not None:
                future.set_result(str(frame))

    async def _list(self) -> float:
        assert self.ws is not None
        request_id = str(uuid.uuid4())
        future: asyncio.Future[str] = self.loop.create_future()
        self.replies[request_id] = future
        began = time.perf_counter()
        await self.ws.send(json.dumps({"type": "list_workflows", "request_id": request_id, "body": LIST_BODY}))
        reply = json.loads(await future)
        took = time.perf_counter() - began
        assert len(reply["output"]) == WORKFLOWS, reply.get("error_message")
        return took

    def list_once(self) -> float:
        return asyncio.run_coroutine_threadsafe(self._list(), self.loop).result(30)

    def close(self) -> None:
        async def shut() -> None:
            self.server.close()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _executor(stack: Stack, name: str, url: str, **extra: str) -> Proc:
    env = {"PATH": str(VENV_BIN), "HOME": "/tmp", "RELAY_URL": url, "RELAY_KEY": stack.key, "APP_NAME": APP,
           "SYS_DB": str(stack.data_dir / "mgmt-sys.sqlite"), "STEP_LOG": str(stack.data_dir / "steps.log"),
           "APP_VERSION": "v1", **extra}
    proc = Proc(name, [PYTHON, str(EXECUTOR_APP)], env=env, logdir=stack.data_dir)
    stack.extra.append(proc)
    return proc


class _Rest:
    """A bare HTTP/1.1 keep-alive client (the standard library's): the baseline has no HTTP client at all, so the
    client's own cost should be as small as can be (httpx parsing a 60 kB reply costs 0.5-2 ms more)."""

    def __init__(self, url: str, key: str) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port, timeout=60)
        self.headers = {"Authorization": f"Bearer {key}"}

    def __enter__(self) -> _Rest:
        return self

    def __exit__(self, *_: object) -> None:
        self.conn.close()

    def list(self) -> bytes:
        self.conn.request("GET", f"/v2/orgs/{ORG}/apps/{APP}/workflows?limit={WORKFLOWS}", headers=self.headers)
        response = self.conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise AssertionError(f"listWorkflows: {response.status} {body[:300]!r}")
        return body


def _timed_lists(client: _Rest, n: int) -> list[float]:
    out = []
    for _ in range(n):
        began = time.perf_counter()
        body = client.list()
        out.append(time.perf_counter() - began)
        assert len(json.loads(body)) == WORKFLOWS
    return out


def run(results: Results) -> None:
    n = scaled(200, minimum=20)
    # Three of P9's four executors die at once: the recovery-storm breaker would pace them (one per
    # RELAY_RECOVERY_PACE_SECS, by design). P9 measures a recovery behind operators' queries, not the breaker.
    stack = start_stack("management", RELAY_MANAGEMENT_TIMEOUT_SECS="30", RELAY_RECOVERY_STORM_MIN_EXECUTORS="1000")
    direct: _Direct | None = None
    try:
        stack.put_app(APP, executorTimeoutSecs=P9_GRACE)
        ids = ",".join(f"wf-{i}" for i in range(WORKFLOWS))
        _executor(stack, "executor", stack.ws_url, FINISHED_WORKFLOWS=ids)
        stack.wait_healthy(APP, 1, timeout=60)
        with _Rest(stack.url, stack.key) as client:
            wait_until(lambda: len(json.loads(client.list())) == WORKFLOWS, timeout=60, what="100 workflows")
            _timed_lists(client, 10)  # warm up
            through = _timed_lists(client, n)

        # The baseline: a second executor process on the same system database, held by a bare conductor.
        direct = _Direct()
        _executor(stack, "direct-executor", f"ws://127.0.0.1:{direct.port}/")
        if not direct.ready.wait(60):
            raise TimeoutError("the direct executor never connected")
        for _ in range(10):
            direct.list_once()
        straight = [direct.list_once() for _ in range(n)]
        added50 = (percentile(through, 50) - percentile(straight, 50)) * 1000
        added99 = (percentile(through, 99) - percentile(straight, 99)) * 1000
        results.absolute("P8", "listWorkflows added latency p50", added50, "ms", at_most=5,
                         note=f"through Relay p50 {percentile(through, 50) * 1000:.1f} ms, straight to the socket "
                              f"{percentile(straight, 50) * 1000:.1f} ms; {n} calls each")
        results.absolute("P8", "listWorkflows added latency p99", added99, "ms",
                         note=f"through Relay p99 {percentile(through, 99) * 1000:.1f} ms, straight "
                              f"{percentile(straight, 99) * 1000:.1f} ms")
        log(f"  P8 added p50 {added50:.1f} ms, p99 {added99:.1f} ms")

        # Routed: a second gateway holds a second executor; the first executor stops, so only the routed one
        # can answer a call made to the first gateway.
        port2 = free_port()
        env2 = {**stack.env, "RELAY_PORT": str(port2)}
        gateway2 = Proc("gateway-2", [RELAY, "gateway"], env=env2, logdir=stack.data_dir)
        stack.extra.append(gateway2)
        wait_until(lambda: _healthy(f"http://127.0.0.1:{port2}"), timeout=60, what="second gateway")
        _executor(stack, "routed-executor", f"ws://127.0.0.1:{port2}/")
        stack.wait_healthy(APP, 2, timeout=60)
        stack.extra[0].stop()  # the first executor: now only the routed one is HEALTHY
        wait_until(lambda: len(stack.rest_executors(APP)) == 1, timeout=60, what="the first executor recovered")
        with _Rest(stack.url, stack.key) as client:
            _timed_lists(client, 5)
            routed = _timed_lists(client, max(20, n // 4))
        results.absolute("P8", "listWorkflows routed through another gateway p50", percentile(routed, 50) * 1000,
                         "ms", note=f"p99 {percentile(routed, 99) * 1000:.1f} ms, against "
                                    f"{percentile(through, 50) * 1000:.1f} ms on the executor's own gateway")
        log(f"  P8 routed p50 {percentile(routed, 50) * 1000:.1f} ms")

        _p9(stack, results, f"http://127.0.0.1:{port2}")
    finally:
        if direct is not None:
            direct.close()
        stack.stop()


def _p9(stack: Stack, results: Results, url: str) -> None:
    """50 concurrent listWorkflows for 10 s on the real executor's gateway (``url``), while three fake executors
    of the app (on the other gateway) drop; their recoveries go to the real executor, the only HEALTHY peer.
    Management requests prefer an executor on the gateway serving them, so none goes to a fake."""
    gen = Generator("p9-loadgen", stack.data_dir)
    try:
        gen.call("connect", url=stack.executor_url(APP), prefix="fake-", start=0, count=3, version="v1")
        stack.wait_healthy(APP, 4, timeout=30)
        stop = time.monotonic() + 10
        done: list[float] = []

        def hammer() -> None:
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {stack.key}"}, timeout=60) as client:
                while time.monotonic() < stop:
                    began = time.perf_counter()
                    client.get(f"/v2/orgs/{ORG}/apps/{APP}/workflows", params={"limit": WORKFLOWS})
                    done.append(time.perf_counter() - began)

        since = time.time()
        with ThreadPoolExecutor(50) as pool:
            futures = [pool.submit(hammer) for _ in range(50)]
            # All three at once, 3 s in: each recovery must then go to the real executor, the only HEALTHY peer
            # left, busy with the queries (dropped one at a time, a recovery may go to a fake about to drop).
            time.sleep(3)
            gen.call("close", prefix="fake-", start=0, count=3, mode="abort")
            for future in futures:
                future.result()
        took = 10.0
        wait_until(lambda: len(stack.audit(APP, ["executor.recovery.succeeded"], since=since)) >= 3, timeout=60,
                   what="the recoveries")
        dead = {ex: t for _, ex, t in stack.audit(APP, ["executor.dead"], since=since)}
        succeeded = {ex: t for _, ex, t in stack.audit(APP, ["executor.recovery.succeeded"], since=since)}
        lags = [succeeded[ex] - dead[ex] for ex in dead if ex in succeeded]
        results.absolute("P9", "listWorkflows throughput, 50 concurrent", len(done) / took, "/s",
                         note=f"p50 {percentile(done, 50) * 1000:.0f} ms, p99 {percentile(done, 99) * 1000:.0f} ms")
        results.absolute("P9", "DEAD -> recovery succeeded meanwhile, max", max(lags), "s", at_most=1,
                         note=f"{len(lags)} recoveries: {', '.join(f'{lag:.2f}' for lag in sorted(lags))} s")
        results.details["p9"] = {"calls": len(done), "lags": lags}
        log(f"  P9 {len(done) / took:.0f} lists/s; recoveries {lags}")
    finally:
        gen.stop()

