"""The P1/P2 baseline: a bare `websockets` asyncio server (compression off) speaking just enough of the
protocol to hold an executor: it sends ``executor_info``, waits for the reply, then reads frames until the
socket closes. Keepalive as websockets ships it (a ping every 20 s, like Relay's server ping interval).

    python -m tests.bench.baseline_server PORT
"""

from __future__ import annotations

import asyncio
import json
import resource
import signal
import sys
import uuid

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed


async def handler(ws: ServerConnection) -> None:
    request_id = str(uuid.uuid4())
    await ws.send(json.dumps({"type": "executor_info", "request_id": request_id}))
    try:
        reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if reply.get("type") != "executor_info" or reply.get("request_id") != request_id:
            await ws.close(1008, "expected executor_info")
            return
        async for _ in ws:
            pass
    except (ConnectionClosed, TimeoutError):
        return


async def main(port: int) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # deliberately standalone: nothing but websockets
    stop = asyncio.get_running_loop().create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set_result, None)
    async with serve(handler, "127.0.0.1", port, compression=None, max_size=1024 * 1024, backlog=2048):
        print("ready", flush=True)
        await stop


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
