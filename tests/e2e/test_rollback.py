"""What a rollback to the previous release does to running lifecycle workflows, as docs/pages/guides/upgrading.md
says: the previous release's code, taken from this repository's history, replays the recorded histories.

The previous release is the code before the newest lifecycle generation (``workflows.lifecycle_generations``; the
patch policy counts releases by generation). Its workers, put back over this release's histories:
- replay every run still on its own generation (the recordings in ``tests/histories/before-generation-6/``): a run
  that began before the upgrade carries on after the rollback;
- fail every run this release started (the recordings of ``tests/histories/``): the newest generation's marker meets
  no ``workflow.patched`` call in the older code, which Temporal's Core refuses as nondeterminism. Such a run's
  workflow task is retried until a worker of the newer release takes it: its timers and recovery wait till then.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workflows import lifecycle_generations
from workflows.contracts.common import LIFECYCLE_WORKFLOW_TYPE

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]

ROOT = Path(__file__).parents[2]
HISTORIES = ROOT / "tests" / "histories"
# The previous release: the last commit before generation 6 came in, and the generation it writes.
PREVIOUS_RELEASE, PREVIOUS_GENERATION = "05a2088", 5
# Run in the previous release's tree: replay each history given, print {path: "ok" or the failure}.
REPLAY = """
import asyncio, json, sys
from pathlib import Path
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from core.temporal import data_converter
from worker import workflow_runner
from workflows.lifecycle import ExecutorLifecycleWorkflow

async def main(paths):
    replayer = Replayer(workflows=[ExecutorLifecycleWorkflow], data_converter=data_converter,
                        workflow_runner=workflow_runner(data_converter))
    out = {}
    for path in paths:
        history = WorkflowHistory.from_json(Path(path).stem, Path(path).read_text())
        try:
            await replayer.replay_workflow(history)
            out[path] = "ok"
        except Exception as err:
            out[path] = f"{type(err).__name__}: {err}"
    print(json.dumps(out))

asyncio.run(main(sys.argv[1:]))
"""


def _lifecycle(path: Path) -> bool:
    """A lifecycle recording, at the SDK's own signal budget (those recorded with a lowered one need it patched in)."""
    first = json.loads(path.read_text())["events"][0]
    return (first["workflowExecutionStartedEventAttributes"]["workflowType"]["name"] == LIFECYCLE_WORKFLOW_TYPE
            and "-signal-budget-" not in path.name)


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the previous release's code comes from its history")
    tree = tmp_path_factory.mktemp("previous-release")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", PREVIOUS_RELEASE, "core", "workflows",
                              "activities", "worker.py"], capture_output=True, timeout=120, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True, timeout=60)
    (tree / "replay.py").write_text(REPLAY)
    return tree


def _replay(tree: Path, paths: list[Path]) -> dict[str, str]:
    done = subprocess.run([sys.executable, "replay.py", *map(str, paths)], cwd=tree, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.splitlines()[-1]))


def test_the_previous_release_writes_the_generation_before_this_ones() -> None:
    assert lifecycle_generations.NEWEST_GENERATION == PREVIOUS_GENERATION + 1, (
        "a new generation: the previous release is now the code before it (PREVIOUS_RELEASE)")


def test_a_rollback_keeps_the_runs_of_its_own_generation_and_strands_those_this_release_started(
        previous_release: Path) -> None:
    own = sorted(p for p in (HISTORIES / "before-generation-6").glob("*.json") if _lifecycle(p))
    started_here = sorted(p for p in HISTORIES.glob("*.json") if _lifecycle(p))
    assert len(own) >= 10 and len(started_here) >= 10, (own, started_here)
    results = _replay(previous_release, own + started_here)
    assert {str(p): results[str(p)] for p in own} == {str(p): "ok" for p in own}
    for path in started_here:
        failure = results[str(path)]
        assert failure.startswith("NondeterminismError") and "patch marker" in failure, (path, failure)
        assert lifecycle_generations.GENERATION_6_PATCH in failure, (path, failure)
