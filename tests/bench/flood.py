"""Wrong-key flood: a good executor's handshake latency with the gateway idle and while hundreds of
sockets with wrong keys retry, and how many log lines the gateway writes meanwhile.

One Relay stack (embedded Temporal dev server, `relay worker`, `relay gateway`), and the flood in a process of
its own (``--attack``): ``FLOOD_SOCKETS`` (300) concurrent clients, each upgrading with a fresh random key, reading
the refusal and trying again ``FLOOD_RETRY_SECS`` later (0: at once, the harshest; 1: the SDKs' pace), for
``FLOOD_SECONDS`` (20). The good handshake is timed from TCP connect to the server's ``executor_info`` frame
(admission, the database and the upgrade are all in it; registering with Temporal is not), a median over
``FLOOD_SAMPLES`` (50).

Run alone with ``python -m tests.bench.flood``; ``make bench`` runs it with the others.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import time
from collections import Counter
from typing import Any

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

from tests.bench.common import PYTHON, ROOT, Results, Stack, cpu_seconds, log, percentile, start_stack

APP = "flood"
SOCKETS = int(os.environ.get("FLOOD_SOCKETS", "300"))
SECONDS = float(os.environ.get("FLOOD_SECONDS", "20"))
RETRY_S = float(os.environ.get("FLOOD_RETRY_SECS", "0"))
SAMPLES = int(os.environ.get("FLOOD_SAMPLES", "50"))
MAX_RATIO = 3.0  # the target: a good handshake during the flood within 3x its idle latency


# -- the good executor -------------------------------------------------------------------------------------


async def handshake_ms(url: str, *, timeout: float = 30) -> float:
    """Milliseconds from TCP connect to the server's ``executor_info`` frame; the socket is then dropped."""
    uri = parse_uri(url)
    began = time.perf_counter()
    reader, writer = await asyncio.wait_for(asyncio.open_connection(uri.host, uri.port), timeout)
    try:
        client = ClientProtocol(uri, max_size=None)
        client.send_request(client.connect())
        writer.write(b"".join(client.data_to_send()))
        async with asyncio.timeout(timeout):
            while True:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("closed before executor_info")
                client.receive_data(data)
                for event in client.events_received():
                    if isinstance(event, Response) and event.status_code != 101:
                        raise ConnectionError(f"refused: HTTP {event.status_code}")
                    if (isinstance(event, Frame) and event.opcode is Opcode.TEXT
                            and json.loads(bytes(event.data)).get("type") == "executor_info"):
                        return (time.perf_counter() - began) * 1000
    finally:
        writer.close()


async def sample(url: str, n: int, *, pause: float = 0.05) -> list[float]:
    """``n`` handshakes, one at a time, between ``pause`` and twice that apart (at random, so the samples do
    not fall into step with the flood's waves of retries)."""
    out = []
    for _ in range(n):
        out.append(await handshake_ms(url))
        await asyncio.sleep(pause * (1 + random.random()))
    return out


# -- the flood (its own process) ---------------------------------------------------------------------------


def _upgrade_request(host: str, port: int, path: str) -> bytes:
    nonce = base64.b64encode(secrets.token_bytes(16)).decode()
    return (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {nonce}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode()


async def _attacker(host: str, port: int, until: float, counts: Counter[str]) -> None:
    while time.monotonic() < until:
        path = f"/websocket/{APP}/dbos_{secrets.token_urlsafe(32)}"
        try:
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(_upgrade_request(host, port, path))
                status_line = await asyncio.wait_for(reader.readline(), 30)
                counts[status_line.split(b" ")[1].decode() if status_line.count(b" ") >= 2 else "no answer"] += 1
            finally:
                writer.close()
        except (OSError, TimeoutError) as err:
            counts[type(err).__name__] += 1
        await asyncio.sleep(RETRY_S)


async def attack(url: str) -> dict[str, Any]:
    uri = parse_uri(url)
    counts: Counter[str] = Counter()
    began = time.monotonic()
    until = began + SECONDS
    await asyncio.gather(*(_attacker(uri.host, uri.port, until, counts) for _ in range(SOCKETS)))
    return {"counts": dict(counts), "seconds": time.monotonic() - began}


# -- the bench ---------------------------------------------------------------------------------------------


def _lines(stack: Stack) -> int:
    """Lines in the gateway's log, but for the good executor's own ("[accepted]"): those are the measurement's."""
    with open(stack.gateway.log_path, "rb") as f:
        return sum(1 for line in f if b"[accepted]" not in line)


def run(results: Results) -> None:
    log(f"flood: good handshakes idle, then during {SOCKETS} wrong-key sockets retrying {RETRY_S:g} s after a refusal "
        f"for {SECONDS:g} s")
    stack = start_stack("flood")
    try:
        stack.put_app(APP)
        url = stack.executor_url(APP)
        asyncio.run(sample(url, 5))  # warm-up: the first handshakes pay for imports and connection pools
        idle = asyncio.run(sample(url, SAMPLES))
        log(f"  idle: median {statistics.median(idle):.1f} ms, p95 {percentile(idle, 95):.1f} ms")

        lines0, cpu0 = _lines(stack), cpu_seconds(stack.gateway.pid)
        with open(stack.data_dir / "flood-attack.log", "ab") as err:
            flood = subprocess.Popen([PYTHON, "-m", "tests.bench.flood", "--attack", stack.ws_url], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
        try:
            time.sleep(min(3.0, SECONDS / 4))  # the flood at full strength before measuring
            during = asyncio.run(sample(url, SAMPLES, pause=max(0.05, (SECONDS / 3) / SAMPLES)))
            out, _ = flood.communicate(timeout=SECONDS + 120)
        finally:
            if flood.poll() is None:
                flood.kill()
                flood.wait()
        report = json.loads(out.strip().splitlines()[-1])
        lines, cpu = _lines(stack) - lines0, cpu_seconds(stack.gateway.pid) - cpu0
        counts: dict[str, int] = report["counts"]
        refusals = sum(v for k, v in counts.items() if k.isdigit() and k != "101")
        log(f"  flood: median {statistics.median(during):.1f} ms, p95 {percentile(during, 95):.1f} ms; "
            f"{refusals} refusals in {report['seconds']:.1f} s {counts}; {lines} gateway log lines; "
            f"gateway CPU {cpu:.1f} s")
        results.details["flood"] = {"idle_ms": idle, "during_ms": during, "counts": counts,
                                    "attack_seconds": report["seconds"], "log_lines": lines, "gateway_cpu_s": cpu}
        results.compare("flood", f"good handshake median, {SOCKETS} wrong-key sockets (vs idle)",
                        statistics.median(during), statistics.median(idle), "ms", max_ratio=MAX_RATIO,
                        note="TCP connect -> executor_info frame")
        results.compare("flood", "good handshake p95 (vs idle p95)", percentile(during, 95),
                        percentile(idle, 95), "ms")
        results.absolute("flood", "wrong-key refusals answered", refusals, "",
                         note=f"{refusals / report['seconds']:.0f}/s, {SOCKETS} sockets retrying after {RETRY_S:g} s")
        results.absolute("flood", "gateway log lines during the flood", lines, "", at_most=20,
                         note="the good executor's own [accepted] lines not counted")
    finally:
        stack.stop()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--attack"]:
        print(json.dumps(asyncio.run(attack(argv[1]))), flush=True)
        return 0
    from tests.bench.__main__ import main as bench

    return bench(["flood"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
