"""`make bench`: ``python -m tests.bench [fleet] [storm] [flood] [management] [rest] [scale]``; with no part named,
all but ``scale`` (a fleet of 10,000 across processes on PostgreSQL: opt-in, ``make bench PARTS=scale``, see
``tests/bench/bench_scale.py``).

Environment: ``BENCH_SCALE`` (default 1; 0.1 for a quick pass) scales every fleet and storm size;
``BENCH_DIR`` (default ``.relay-bench``) holds the data dirs, logs and ``results.json``.
"""

from __future__ import annotations

import os
import sys
import time

from tests.bench import bench_fleet, bench_management, bench_rest, bench_scale, bench_storm, flood
from tests.bench.common import SCALE, Results, log, raise_nofile, write_results

BENCHES = {"fleet": bench_fleet.run, "storm": bench_storm.run, "flood": flood.run, "management": bench_management.run,
           "rest": bench_rest.run, "scale": bench_scale.run}
OPT_IN = {"scale"}  # run only when named


def main(argv: list[str]) -> int:
    chosen = argv or [name for name in BENCHES if name not in OPT_IN]
    unknown = [name for name in chosen if name not in BENCHES]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {list(BENCHES)}", file=sys.stderr)
        return 2
    limit = raise_nofile()
    log(f"Relay benchmarks {chosen}, scale {SCALE:g}, RLIMIT_NOFILE {limit}")
    started = time.time()
    results = Results()
    failed = []
    for name in chosen:
        results.details[f"{name}_loadavg_before"] = os.getloadavg()
        try:
            BENCHES[name](results)
        except Exception as err:  # keep the other benchmarks' figures
            log(f"{name} failed: {type(err).__name__}: {err}")
            results.details[f"{name}_error"] = f"{type(err).__name__}: {err}"
            failed.append(name)
        results.details[f"{name}_loadavg_after"] = os.getloadavg()
    path = write_results(results, started)
    print()
    elapsed = time.time() - started
    print(f"Relay benchmarks (scale {SCALE:g}, {elapsed:.0f} s, {os.cpu_count()} CPUs); results in {path}")
    busy = max(v[0] for k, v in results.details.items() if k.endswith(("_loadavg_before", "_loadavg_after")))
    if busy > (os.cpu_count() or 1):
        print(f"note: the machine was busy with other work (1-min load average up to {busy:.1f}); "
              "throughput and latency figures suffer first")
    print(results.table())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
