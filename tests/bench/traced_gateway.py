"""`relay gateway` with tracemalloc on, for `python -m tests.bench.profile memory`: SIGUSR1 writes a
snapshot to ``$BENCH_SNAPSHOT_DIR/snapshot-<n>.pickle`` and the count of gc-tracked objects by type to
``types-<n>.json``. Relay's code is run as is, only observed."""

from __future__ import annotations

import gc
import json
import os
import signal
import tracemalloc
from pathlib import Path
from types import FrameType


def _dump(_signum: int, _frame: FrameType | None) -> None:
    folder = Path(os.environ["BENCH_SNAPSHOT_DIR"])
    n = len(list(folder.glob("snapshot-*.pickle")))
    tracemalloc.take_snapshot().dump(str(folder / f"snapshot-{n}.pickle"))
    gc.collect()
    types: dict[str, int] = {}
    for obj in gc.get_objects():
        name = f"{type(obj).__module__}.{type(obj).__qualname__}"
        types[name] = types.get(name, 0) + 1
    (folder / f"types-{n}.json").write_text(json.dumps(types))
    (folder / f"snapshot-{n}.done").touch()


if __name__ == "__main__":
    tracemalloc.start(int(os.environ.get("BENCH_TRACE_FRAMES", "12")))
    signal.signal(signal.SIGUSR1, _dump)
    from cli.main import main

    main(["gateway"])
