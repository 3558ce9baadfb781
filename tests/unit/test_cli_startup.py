"""`relay` starts light: a command that only calls the REST API loads neither Temporal's SDK nor the database's
modules (SQLAlchemy, SQLModel, Alembic) nor the web framework. Those are imported by the commands that use them,
so `relay workflows list` starts in about a third of the time it took when every command loaded everything."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import starts_processes

HEAVY = {"temporalio", "sqlalchemy", "sqlmodel", "alembic", "fastapi", "uvicorn"}
WEB = {"fastapi", "starlette", "uvicorn"}
LOADED = ("import sys, json; import cli.main; "
          f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(HEAVY)!r}))))")


@starts_processes
def test_the_cli_loads_no_sdk_database_or_web_framework_to_parse_a_command() -> None:
    done = subprocess.run([sys.executable, "-c", LOADED], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


@starts_processes
def test_the_check_sees_a_heavy_import() -> None:
    """The same probe after importing the store: it must name what was loaded."""
    probe = LOADED.replace("import cli.main;", "import cli.main; import core.store;")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    assert {"sqlalchemy", "sqlmodel"} <= set(json.loads(done.stdout))


@starts_processes
def test_the_worker_process_loads_no_web_framework() -> None:
    """`relay worker` serves no HTTP of its own (its probes are ``core.metrics``'): what it imports to run
    (``cli.serve``) loads neither FastAPI, Starlette nor uvicorn, a second of CPU at every start."""
    probe = LOADED.replace("import cli.main;", "import cli.main; import cli.serve;").replace(
        repr(sorted(HEAVY)), repr(sorted(WEB)))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    # The same probe sees the web stack where it is loaded.
    loaded = subprocess.run([sys.executable, "-c", probe.replace("import cli.serve;", "import cli.web;")],
                            capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
    assert set(json.loads(loaded.stdout)) == WEB, loaded.stderr
