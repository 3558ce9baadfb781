"""Replay the recorded histories in ``tests/histories/`` against the current workflow code.

A history that no longer replays means the code would break workflows running in production (Temporal replays
their history on the new code): guard the change with ``workflow.patched`` instead
(docs/pages/contributing/changing-a-workflow.md). The histories in ``tests/histories/retired/`` are those of lifecycle
generations (and patches) whose branches were removed on purpose (docs/pages/contributing/patch-policy.md): each must
now fail to replay, as a run of them still open would, and `relay patches check` must name their generations. The mutant
tests prove the check has teeth: copies of the workflow modules with an activity call moved, dropped or a timer added
must each fail to replay. The lifecycle workflow is one class in three modules
(``lifecycle_base``, ``recovery``, ``lifecycle``): each mutant changes one of them, and the copies import each
other, so a mutation reaches the workflow wherever its code lives.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import importlib.util
import json
import re
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import ModuleType

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner
from temporalio.workflow import NondeterminismError

from cli.patches_check import generation_of
from core.temporal import data_converter
from tests.histories.record import record, start_env
from tests.histories.scenarios import SCENARIOS
from tests.quick import QUICK, sample
from worker import workflow_runner
from workflows import gateway_watch, lifecycle, lifecycle_base, lifecycle_generations, recovery
from workflows.gateway_watch import GatewayWorkflow
from workflows.lifecycle import ExecutorLifecycleWorkflow
from workflows.retention import RetentionWorkflow

HISTORIES = Path(__file__).parents[1] / "histories"
# Recordings of code whose branches are gone (the policy's removals): they must fail to replay.
RETIRED = HISTORIES / "retired"
# The current recordings, and older ones in subfolders, that must replay.
FIXTURES = sorted(p for p in HISTORIES.rglob("*.json") if not p.is_relative_to(RETIRED))
RETIRED_FIXTURES = sorted(RETIRED.rglob("*.json"))
_BUDGET = re.compile(r"-signal-budget-(\d+)\b")


@functools.cache  # decoding a fixture's JSON into protobuf takes ~15 ms; the mutants replay the same ones again
def _history(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text())


def _workflow_type(history: WorkflowHistory) -> str:
    return history.events[0].workflow_execution_started_event_attributes.workflow_type.name


def _signal_budget(path: Path) -> int | None:
    match = _BUDGET.search(path.name)
    return int(match.group(1)) if match else None


async def _replay(path: Path, workflows: list[type], monkeypatch: pytest.MonkeyPatch,
                  budget_module: ModuleType = lifecycle_base, *, sandboxed: bool = True) -> Exception | None:
    """Replay one fixture; the failure, or None. A history recorded with a lowered ``SIGNAL_BUDGET`` (named in
    its file) replays with the same budget, which only reaches the workflow outside the sandbox."""
    budget = _signal_budget(path)
    with monkeypatch.context() as patch:  # undone after this replay, not at the end of the test
        if budget is not None:
            patch.setattr(budget_module, "SIGNAL_BUDGET", budget)
            sandboxed = False
        [failure] = await _replay_in_lanes([path], workflows, sandboxed=sandboxed)
    return failure


# Replayers working at once: between two histories a replayer mostly waits on the SDK core, so four of them side
# by side take the time of the Python work alone (102 fixtures: 17 s one by one, 7 s in four lanes).
LANES = 4


async def _replay_in_lanes(paths: list[Path], workflows: list[type], *, sandboxed: bool) -> list[Exception | None]:
    """Replay every fixture, in ``LANES`` replayers at once, each replaying its share one history after another
    (as a worker would); the failure of each, in the order of ``paths``. No lowered signal budget here."""
    failures: list[Exception | None] = [None] * len(paths)

    async def lane(share: list[int]) -> None:
        replayer = Replayer(
            workflows=workflows,
            data_converter=data_converter,
            workflow_runner=workflow_runner(data_converter) if sandboxed else UnsandboxedWorkflowRunner(),
        )

        async def histories() -> AsyncIterator[WorkflowHistory]:
            for n in share:
                yield _history(paths[n])

        async with replayer.workflow_replay_iterator(histories()) as results:
            for n, result in zip(share, [r async for r in results], strict=True):
                failures[n] = result.replay_failure

    await asyncio.gather(*(lane(list(range(start, len(paths), LANES))) for start in range(min(LANES, len(paths)))))
    return failures


async def _replay_all(paths: list[Path], workflows: list[type], monkeypatch: pytest.MonkeyPatch,
                      budget_module: ModuleType = lifecycle_base, *, sandboxed: bool = True
                      ) -> dict[str, Exception | None]:
    """Replay every fixture (those with a lowered signal budget one at a time, each with its budget); the failure
    of each, or None, by file name relative to ``tests/histories``."""
    plain = [p for p in paths if _signal_budget(p) is None]
    failures = dict(zip(plain, await _replay_in_lanes(plain, workflows, sandboxed=sandboxed), strict=True))
    for path in paths:
        if path not in failures:
            failures[path] = await _replay(path, workflows, monkeypatch, budget_module, sandboxed=sandboxed)
    return {str(path.relative_to(HISTORIES)): failures[path] for path in paths}


def test_every_scenario_has_its_fixtures() -> None:
    """A fixture deleted (or a scenario added but never recorded) must not pass by replaying nothing."""
    missing = [s.name for s in SCENARIOS
               if not any(HISTORIES.glob(f"{s.stem}.json")) and not any(HISTORIES.glob(f"{s.stem}.[0-9]*.json"))]
    assert not missing, f"no fixture for {missing}: run `.venv/bin/python -m tests.histories.record`"
    types = {_recorded_type(path) for path in FIXTURES}
    assert types == {"ExecutorLifecycleWorkflow", "GatewayWorkflow", "RetentionWorkflow"}


# The current recordings, then each folder of older ones (a test each, so they spread over the xdist workers). In
# `make check`'s quick run a third of each older folder's, `make test` every one (tests/quick.py).
FOLDERS = sorted({p.parent for p in FIXTURES}, key=lambda folder: (folder != HISTORIES, folder.name))


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: "current" if f == HISTORIES else f.name)
async def test_recorded_history_replays(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [p for p in FIXTURES if p.parent == folder]
    paths = paths if folder == HISTORIES else sample(paths)  # the quick run: a third of the older recordings
    failures = await _replay_all(paths, [ExecutorLifecycleWorkflow, GatewayWorkflow, RetentionWorkflow], monkeypatch)
    broken = {name: failure for name, failure in failures.items() if failure is not None}
    assert paths and not broken, (
        f"{', '.join(broken)} no longer replay: {broken!r}. Running workflows would fail the same way; guard the "
        "change with workflow.patched (docs/pages/contributing/changing-a-workflow.md)"
    )


# -- retired: removed on purpose ----------------------------------------------------------------------------------


def _went_past_the_hold(history: WorkflowHistory) -> bool:
    """A gateway watch run whose hold failed: it took a branch of the patches whose old branches are gone."""
    return any(e.activity_task_scheduled_event_attributes.activity_type.name != "hold_gateway"
               for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)


async def test_a_retired_history_fails_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """The branches of lifecycle generations 0 to 2 are removed (and the gateway watch's old branches, its patches
    deprecated): a run recorded by that code fails on today's with nondeterminism, as such a run still open would
    after an upgrade, which is why `relay patches check` must pass first. A gateway watch run that never went past
    its hold took no patched branch, and still replays."""
    assert RETIRED_FIXTURES
    failures = await _replay_all(RETIRED_FIXTURES, [ExecutorLifecycleWorkflow, GatewayWorkflow], monkeypatch,
                                 sandboxed=False)
    expected = {str(p.relative_to(HISTORIES)) for p in RETIRED_FIXTURES
                if _recorded_type(p) == "ExecutorLifecycleWorkflow" or _went_past_the_hold(_history(p))}
    failed = {name for name, failure in failures.items() if failure is not None}
    assert failed == expected, sorted(failed ^ expected)
    others = {name: repr(failures[name])[:300] for name in failed if not _incompatible(failures[name])}
    assert not others, others
    # Most say so in those words: a marker of a generation no code asks for, or another command in its place.
    nondeterminism = [name for name in failed if isinstance(failures[name], NondeterminismError)]
    assert len(nondeterminism) >= 0.9 * len(failed), sorted(failed - set(nondeterminism))


# Each folder's lifecycle runs, by the generation their first workflow task wrote (0: none, before generation 1).
GENERATION_OF_FOLDER = {"histories": 6, "before-generation-6": 5, "before-generation-5": 4, "before-generation-4": 3,
                        "before-generation-3": 2, "before-generation-2": 1, "before-own-alerts-at-once": 1}


def test_the_check_reads_each_recorded_runs_generation() -> None:
    """`relay patches check` reads a run's generation off its history: every recording, retired or not, reads as
    the generation its folder was recorded under, and those that replay are exactly those of a generation this
    code replays."""
    oldest = lifecycle_generations.OLDEST_REPLAYED_GENERATION
    read = {p: generation_of(_history(p).events) for p in [*FIXTURES, *RETIRED_FIXTURES]
            if _recorded_type(p) == "ExecutorLifecycleWorkflow"}
    wrong = {str(p.relative_to(HISTORIES)): g for p, g in read.items()
             if g != GENERATION_OF_FOLDER.get(p.parent.name, 0)}
    assert not wrong, wrong
    assert all(g is not None and g >= oldest for p, g in read.items() if p in FIXTURES)
    assert all(g is not None and g < oldest for p, g in read.items() if p in RETIRED_FIXTURES)
    assert lifecycle_generations.GENERATIONS[lifecycle_generations.GENERATION_6_PATCH] == (
        lifecycle_generations.NEWEST_GENERATION)
    assert oldest <= lifecycle_generations.NEXT_RELEASE_REPLAYS_FROM <= lifecycle_generations.NEWEST_GENERATION
    # A run that has completed no workflow task has run no code: no generation yet.
    assert generation_of(_history(FIXTURES[0]).events[:3]) is None


# -- mutants: the replay must catch an incompatible change -----------------------------------------------------


Mutation = Callable[[ast.Module], None]


def _activity_call(stmt: ast.stmt) -> bool:
    """``await workflow.execute_activity(...)`` or ``await self._db/_audit/_record(...)`` as a statement."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Await)
            and isinstance(stmt.value.value, ast.Call) and isinstance(stmt.value.value.func, ast.Attribute)):
        return False
    return stmt.value.value.func.attr in {"execute_activity", "_db", "_audit", "_record"}


def _bodies(tree: ast.Module) -> list[list[ast.stmt]]:
    return [body for node in ast.walk(tree) for name in ("body", "orelse", "finalbody")
            if isinstance(body := getattr(node, name, None), list) and body and isinstance(body[0], ast.stmt)]


def flip_a_patch(tree: ast.Module) -> None:
    """Swap the two branches of the first ``if self._patched(...)`` that has both (today: the confirmed
    recovery's audit row and deletion, one local activity or two): a patch written the wrong way round."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.If) and node.orelse and isinstance(node.test, ast.Call)
                and isinstance(node.test.func, ast.Attribute) and node.test.func.attr == "_patched"):
            node.body, node.orelse = node.orelse, node.body
            return
    raise AssertionError("no patch with both branches left to flip: pick another mutation")


def drop_an_activity_call(tree: ast.Module) -> None:
    """Replace an activity call made as a plain statement with ``pass`` (an activity dropped)."""
    for body in reversed(_bodies(tree)):
        for n in reversed(range(len(body))):
            if _activity_call(body[n]):
                body[n] = ast.Pass()
                return
    raise AssertionError("no activity call left to drop")


def drop_the_removals_delete(tree: ast.Module) -> None:
    """Replace the removal's delete (the activity call in ``_remove``) with ``pass``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.AsyncFunctionDef) and node.name == "_remove":
            body = node.body
            for n, stmt in enumerate(body):
                if _activity_call(stmt):
                    body[n] = ast.Pass()
                    return
    raise AssertionError("no activity call in _remove")


def timer_first(tree: ast.Module) -> None:
    """Start every run with a one-second timer the recorded histories do not have."""
    for node in ast.walk(tree):
        if isinstance(node, ast.AsyncFunctionDef) and node.name == "run":
            sleep = ast.parse("await workflow.sleep(1)").body
            node.body[:0] = sleep
            return
    raise AssertionError("no run method")


def unchanged(tree: ast.Module) -> None:
    """The control: a copy loaded the same way, not mutated, must replay every fixture."""


# The lifecycle workflow's modules in import order: each imports only those before it.
LIFECYCLE_MODULES = (lifecycle_base, recovery, lifecycle)


def _load_copies(modules: tuple[ModuleType, ...], target: ModuleType, mutate: Mutation, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> list[ModuleType]:
    """Copies of ``modules`` (in import order), ``target``'s mutated, loaded from temp files under other names, each
    importing the copies before it instead of the originals; the real files are never touched."""
    assert target in modules
    renamed: dict[str, str] = {}
    copies = []
    for module in modules:
        assert module.__file__ is not None
        tree = ast.parse(Path(module.__file__).read_text())
        if module is target:
            mutate(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in renamed:
                node.module = renamed[node.module]
        name = f"replay_mutant_{module.__name__.replace('.', '_')}_{mutate.__name__}"
        path = tmp_path / f"{name}.py"
        path.write_text(ast.unparse(ast.fix_missing_locations(tree)))
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        copy = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, copy)  # dataclass and type-hint resolution look the module up
        spec.loader.exec_module(copy)
        renamed[module.__name__] = name
        copies.append(copy)
    return copies


def _incompatible(failure: Exception | None) -> bool:
    """A failure the change itself caused, not a broken copy: nondeterminism, or a recorded result that does not
    decode as the result type of the activity now called there (activities are called through typed stubs, so
    a call shifted onto another's recorded result can fail on its type before the command types are compared)."""
    return isinstance(failure, NondeterminismError) or (
        isinstance(failure, RuntimeError) and any(sign in str(failure) for sign in _INCOMPATIBLE))


# Signs of a shifted history in a failed activation: Core reports a local activity's recorded marker that does not
# match the command now issued (the database activities and the recovery gate are local activities) as a failed
# activation, not a ``NondeterminismError``; and a recorded ``None`` (an activity returning nothing) handed to the
# gate's call, which reads its reply, fails on it; and a recorded activity event a command's state machine
# cannot take (a removal's delete dropped, the next command meets the scheduled activity it left behind).
_INCOMPATIBLE = ("Failed decoding arguments", "Nondeterminism error", "'NoneType' object has no attribute",
                 "transition is invalid")


def _recorded_type(path: Path) -> str:
    """The workflow type of a fixture, read off its JSON: every process that collects this module does this for
    every fixture, and ``_history`` (the whole history decoded into protobuf) takes seconds for all of them."""
    started = json.loads(path.read_text())["events"][0]["workflowExecutionStartedEventAttributes"]
    return str(started["workflowType"]["name"])


LIFECYCLE_FIXTURES = [p for p in FIXTURES if _recorded_type(p) == "ExecutorLifecycleWorkflow"]
GATEWAY_FIXTURES = [p for p in FIXTURES if _recorded_type(p) == "GatewayWorkflow"]
# The mutants replay every lifecycle fixture; in `make check`'s quick run only the current recordings (the older
# ones, in subfolders, are replayed by test_recorded_history_replays either way).
MUTANT_FIXTURES = [p for p in LIFECYCLE_FIXTURES if not QUICK or p.parent == HISTORIES]


@pytest.mark.parametrize(("mutate", "target"), [
    (flip_a_patch, recovery),
    (drop_an_activity_call, recovery),
    (drop_the_removals_delete, lifecycle),
    (drop_an_activity_call, lifecycle_base),  # the audit write
    (timer_first, lifecycle),
    (unchanged, lifecycle),
], ids=lambda m: m.__name__)
async def test_a_changed_lifecycle_workflow_fails_replay(
    mutate: Mutation, target: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, *_, copy = _load_copies(LIFECYCLE_MODULES, target, mutate, tmp_path, monkeypatch)
    workflows = [copy.ExecutorLifecycleWorkflow, GatewayWorkflow]
    # Unsandboxed: the sandbox would re-import the copy by name from a path it cannot see.
    failures = await _replay_all(MUTANT_FIXTURES, workflows, monkeypatch, base, sandboxed=False)
    caught = {name for name, failure in failures.items() if failure is not None}
    if mutate is unchanged:
        assert not caught, failures
        return
    assert caught, f"{mutate.__name__}: every fixture still replays, so replay tests could never fail"
    others = {name: repr(failures[name])[:300] for name in caught if not _incompatible(failures[name])}
    assert not others, others
    if mutate not in (drop_an_activity_call, drop_the_removals_delete):  # these may touch only the removal paths
        assert "happy-recovery.json" in caught


async def test_a_changed_gateway_workflow_fails_replay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    [copy] = _load_copies((gateway_watch,), gateway_watch, timer_first, tmp_path, monkeypatch)
    failures = await _replay_all(GATEWAY_FIXTURES, [ExecutorLifecycleWorkflow, copy.GatewayWorkflow], monkeypatch,
                                 sandboxed=False)
    assert GATEWAY_FIXTURES
    assert all(isinstance(failure, NondeterminismError) for failure in failures.values()), failures


# -- what a new run writes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["happy-recovery", "recovered-via-its-own-gateway"])
async def test_a_new_run_asks_for_one_patch_only(name: str) -> None:
    """A run started by today's code writes one patch marker (the generation's) and one ``TemporalChangeVersion``
    upsert, not one per patch: on the way from the grace's end to DEAD it writes none. Played live, so a
    ``workflow.patched`` added outside the generation shows here before anyone re-records a fixture."""
    scenario = next(s for s in SCENARIOS if s.name == name)
    env = await start_env()
    try:
        [history] = await record(env, scenario)
    finally:
        await env.shutdown()
    patches = [e.marker_recorded_event_attributes.details["patch-data"] for e in history.events
               if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
               and "patch-data" in e.marker_recorded_event_attributes.details]
    versions = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
                and "TemporalChangeVersion" in e.upsert_workflow_search_attributes_event_attributes
                .search_attributes.indexed_fields]
    assert len(patches) == 1 and lifecycle_generations.GENERATION_6_PATCH.encode() in patches[0].payloads[0].data
    assert len(versions) == 1
    timer = next(n for n, e in enumerate(history.events) if e.event_type == EventType.EVENT_TYPE_TIMER_FIRED)
    assert not [e for e in history.events[timer:] if e.event_type in (
        EventType.EVENT_TYPE_MARKER_RECORDED, EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES)
        and (e.marker_recorded_event_attributes.details.get("patch-data") is not None
             or "TemporalChangeVersion" in e.upsert_workflow_search_attributes_event_attributes.search_attributes
             .indexed_fields)]


def _local_activities(history: WorkflowHistory) -> list[tuple[int, str]]:
    """Each local activity's marker in ``history``: (event index, activity type)."""
    out = []
    for n, e in enumerate(history.events):
        data = e.marker_recorded_event_attributes.details.get("data") if (
            e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED) else None
        if data is not None:
            out.append((n, json.loads(data.payloads[0].data)["activity_type"]))
    return out


async def test_a_death_is_declared_in_one_local_activity() -> None:
    """From the probe that confirms the executor gone to the recovery's dispatch, a new run makes one local
    activity, ``declare_dead`` (DEAD recorded, the gate asked, a peer chosen, the gateway checked), not four:
    each is a marker and a round trip to the database inside the workflow task that a burst of deaths queues on."""
    scenario = next(s for s in SCENARIOS if s.name == "happy-recovery")
    env = await start_env()
    try:
        [history] = await record(env, scenario)
    finally:
        await env.shutdown()
    scheduled = [(n, e.activity_task_scheduled_event_attributes.activity_type.name) for n, e in
                 enumerate(history.events) if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    first_probe = next(n for n, name in scheduled if name == "probe_gateway")
    dispatch = next(n for n, name in scheduled if name == "dispatch_recovery")
    between = [name for n, name in _local_activities(history) if first_probe < n < dispatch]
    assert between == ["declare_dead"], between
