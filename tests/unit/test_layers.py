"""Imports between Relay's top-level packages point one way (docs/pages/contributing/architecture.md). A forbidden
import fails here, whether at module level or inside a function."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What each top-level package may import of Relay's own packages (itself always).
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "workflows": {"core"},  # only the types the kernel and the contracts share (WORKFLOWS_MAY_IMPORT)
    "activities": {"core", "workflows"},
    "gateway": {"core", "workflows"},
    "api": {"core", "gateway", "workflows"},
    "worker": {"core", "activities", "workflows"},
    "cli": {"core", "api", "gateway", "worker", "workflows"},
}
# Of the kernel, the workflows import only its shared types (pure dataclasses and enums, passed through the sandbox).
WORKFLOWS_MAY_IMPORT = {"core.types"}
# Deterministic workflow code re-imported by the sandbox: nothing that does I/O or serves requests.
WORKFLOWS_FORBIDDEN = {"fastapi", "starlette", "sqlalchemy", "sqlmodel", "websockets", "uvicorn", "httpx",
                       "psycopg", "requests", "socket", "sqlite3", "subprocess", "prometheus_client"}


def _sources(package: str) -> list[Path]:
    single = ROOT / f"{package}.py"
    return [single] if single.exists() else sorted((ROOT / package).rglob("*.py"))


def _nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of the file's syntax tree (``ast.walk``'s order)."""
    return _walked(path.read_text(), str(path))


@functools.cache  # the rules below walk every source file again: parsed and walked once per text
def _walked(text: str, filename: str) -> tuple[ast.AST, ...]:
    return tuple(ast.walk(ast.parse(text, filename=filename)))


def _imported(path: Path) -> set[str]:
    """Top-level names of every module the file imports, wherever the import statement is."""
    names: set[str] = set()
    for node in _nodes(path):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _modules(path: Path) -> set[str]:
    """Dotted names of every module the file imports from (Relay's and others)."""
    names: set[str] = set()
    for node in _nodes(path):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def violations(package: str, sources: list[Path]) -> list[str]:
    found = []
    for path in sources:
        if package == "workflows":
            where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
            found += [f"{where} imports {m} (of core, workflows import only {sorted(WORKFLOWS_MAY_IMPORT)})"
                      for m in sorted(_modules(path)) if m.split(".")[0] == "core" and m not in WORKFLOWS_MAY_IMPORT]
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
        for name in sorted(_imported(path)):
            if name in ALLOWED and name != package and name not in ALLOWED[package]:
                found.append(f"{where} imports {name}")
            if package == "workflows" and name in WORKFLOWS_FORBIDDEN:
                found.append(f"{where} imports {name} (workflows do no I/O)")
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_one_way(package: str) -> None:
    sources = _sources(package)
    assert sources, f"no sources for {package}"
    assert violations(package, sources) == []


def test_the_rule_catches_an_upward_import(tmp_path: Path) -> None:
    bad, sneaky = tmp_path / "bad.py", tmp_path / "sneaky.py"
    bad.write_text("def f() -> None:\n    from api import app  # noqa\n")
    sneaky.write_text("import sqlalchemy\n")
    assert violations("core", [bad]) == ["bad.py imports api"]
    assert violations("workflows", [sneaky]) == ["sneaky.py imports sqlalchemy (workflows do no I/O)"]
    kernel = tmp_path / "kernel.py"
    kernel.write_text("from core.types import ExecutorStatus\nfrom core.models import Executor\n")
    assert violations("workflows", [kernel]) == [
        "kernel.py imports core.models (of core, workflows import only ['core.types'])"]


def test_no_package_cycle() -> None:
    """The allowed graph itself has no loop."""
    seen: dict[str, int] = {}

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, f"cycle {' -> '.join((*path, node))}"
        if seen.get(node):
            return
        for child in ALLOWED[node]:
            visit(child, (*path, node))
        seen[node] = 1

    for package in ALLOWED:
        visit(package, ())


# -- the REST API sees the gateway through its facade; signals are named once -----------------------------------

PRODUCT = ("activities", "api", "cli", "core", "gateway", "workflows", "worker")


def facade_violations(sources: list[Path]) -> list[str]:
    """``api/`` imports ``gateway`` (its ``__init__``: the ``Gateway`` and what its methods take and return), never
    a module inside it."""
    found = []
    for path in sources:
        for node in _nodes(path):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                     else [])
            found += [f"{path.name} imports {n}" for n in names if n.startswith("gateway.")]
    return found


def string_signals(sources: list[Path]) -> list[str]:
    """A signal sent by a string of its own (``handle.signal("x", ...)``, ``start_signal="x"``) rather than by the
    workflow's method or the contract's ``Signal`` name."""
    found = []
    for path in sources:
        for node in _nodes(path):
            if not isinstance(node, ast.Call):
                continue
            literal = [a for a in node.args[:1] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if isinstance(node.func, ast.Attribute) and node.func.attr == "signal" and literal:
                found.append(f"{path.name}:{node.lineno} signal({literal[0].value!r})")
            found += [f"{path.name}:{node.lineno} start_signal={k.value.value!r}" for k in node.keywords
                      if k.arg == "start_signal" and isinstance(k.value, ast.Constant)]
    return found


def test_the_api_sees_only_the_gateways_facade() -> None:
    assert facade_violations(_sources("api")) == []


def test_no_signal_is_sent_by_a_string_of_its_own() -> None:
    assert [v for package in PRODUCT for v in string_signals(_sources(package))] == []


def test_the_facade_and_signal_rules_catch_a_breach(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from gateway.hub import Hub\nimport gateway.runtime\nfrom gateway import Gateway\n"
                   "async def f(h, c):\n    await h.signal('removed', 1)\n    await h.signal(W.removed, 1)\n"
                   "    await c.start_workflow(x, start_signal='connected')\n")
    assert facade_violations([bad]) == ["bad.py imports gateway.hub", "bad.py imports gateway.runtime"]
    assert string_signals([bad]) == ["bad.py:5 signal('removed')", "bad.py:7 start_signal='connected'"]


def private_imports(sources: list[Path]) -> list[str]:
    """A private name (``_x``) imported from another of Relay's modules: what two modules share is public, in the
    module it belongs to (``cli/common.py`` for the command line). A package's ``__init__`` may re-export its own
    submodules' names."""
    found = []
    for path in sources:
        for node in _nodes(path):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.split(".")[0] in (*PRODUCT, "workflows")):
                continue
            package = ".".join(path.relative_to(ROOT).parent.parts) if path.is_relative_to(ROOT) else ""
            own = path.name == "__init__.py" and node.module.startswith(f"{package}.")
            found += [f"{path.name} imports {node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not own]
    return found


def test_no_module_imports_anothers_private_names() -> None:
    assert [v for package in PRODUCT for v in private_imports(_sources(package))] == []


def test_the_private_import_rule_catches_one(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from cli.admin import _api, app_argument\n")
    assert private_imports([bad]) == ["bad.py imports cli.admin._api"]


# -- no product module over 600 lines ----------------------------------------------------------------------------

MAX_MODULE_LINES = 600


def test_no_product_module_is_over_the_limit() -> None:
    long = {str(p.relative_to(ROOT)) for package in PRODUCT for p in _sources(package)
            if len(p.read_text().splitlines()) > MAX_MODULE_LINES}
    assert not long, f"over {MAX_MODULE_LINES} lines: {sorted(long)}"


# -- workflow code the sandbox passes through imports only what is deterministic ---------------------------------

# Workflow code in a module the worker passes through the sandbox (worker.PASSED_THROUGH) is imported once, outside
# it: the sandbox no longer stops a clock read or I/O there, so this does. Such a module may import only these (and
# from ``datetime`` only ``timedelta``); its Relay imports must be passed through too.
PASSED_THROUGH_MAY_IMPORT = {"__future__", "asyncio", "collections.abc", "contextlib", "dataclasses", "datetime",
                             "typing", "temporalio", "temporalio.common", "temporalio.exceptions",
                             "temporalio.workflow"}


def _passed_through() -> tuple[str, ...]:
    """worker.PASSED_THROUGH, read from the source (importing the worker would load Temporal's SDK here)."""
    for node in ast.parse((ROOT / "worker.py").read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["PASSED_THROUGH"]:
            names: tuple[str, ...] = ast.literal_eval(node.value)
            return names
    raise AssertionError("worker.py assigns no PASSED_THROUGH")


def passed_through_violations(path: Path, passed: tuple[str, ...]) -> list[str]:
    def allowed(module: str) -> bool:
        if module.split(".")[0] not in PRODUCT:
            return module in PASSED_THROUGH_MAY_IMPORT
        return module == "workflows" or any(module == p or module.startswith(f"{p}.") for p in passed)

    found = [f"{path.name} imports {m}" for m in sorted(_modules(path)) if not allowed(m)]
    for node in _nodes(path):
        if isinstance(node, ast.ImportFrom) and node.module == "datetime":
            found += [f"{path.name} imports datetime.{a.name}" for a in node.names if a.name != "timedelta"]
    return found


def test_workflow_code_passed_through_the_sandbox_imports_only_what_is_deterministic() -> None:
    passed = _passed_through()
    workflow_code = [ROOT / (name.replace(".", "/") + ".py") for name in passed if name.startswith("workflows.")]
    assert [p for p in workflow_code if p.exists()], passed
    assert [v for p in workflow_code if p.exists() for v in passed_through_violations(p, passed)] == []


def test_the_passed_through_rule_catches_a_clock_and_io(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nfrom datetime import datetime, timedelta\nfrom workflows.lifecycle import X\n"
                   "from workflows.contracts.common import Candidate\n")
    assert passed_through_violations(bad, ("workflows.contracts",)) == [
        "bad.py imports time", "bad.py imports workflows.lifecycle", "bad.py imports datetime.datetime"]


CLIENTS = ROOT / "clients"


def test_the_clients_import_nothing_of_relays() -> None:
    """What executors run (clients/) stands alone: installed into an application, it has none of Relay's packages."""
    sources = sorted(CLIENTS.rglob("*.py"))
    assert sources, "no client sources found"
    wrong = {str(p.relative_to(ROOT)): sorted(_imported(p) & set(ALLOWED)) for p in sources}
    assert {p: names for p, names in wrong.items() if names} == {}


def test_the_python_client_stays_off_dbos_proprietary_code() -> None:
    """relay-dbos is an application-level client on DBOS's MIT API: no import of the proprietary add-on or of the
    SDK's entitlement module, and no conductor key given to DBOS (which would make dbos >= 3.3 load the add-on)."""
    sources = sorted((CLIENTS / "python" / "relay_dbos").rglob("*.py"))
    assert sources, "no relay_dbos sources found"
    for path in sources:
        modules = _modules(path)
        assert not {m for m in modules if m.split(".")[0] == "dbos_enterprise" or "_enterprise" in m}, path
        assert _conductor_settings(path) == [], path


# The TypeScript and Go clients, read as text: an import of the add-on, a conductor key or URL set, or a conductor
# factory registered. Comments may name them (the READMEs and headers say why they never do).
FORBIDDEN = {
    "typescript": re.compile(r"""(from|require\()\s*['"]@dbos-inc/dbos-enterprise|\bconductorKey\s*[:=]|"""
                             r"""\bconductorURL\s*[:=]|registerConductor"""),
    "go": re.compile(r""""go\.dbos\.dev/dbos-enterprise-go|\bConductorAPIKey\s*:|\bConductorURL\s*:|"""
                     r"""RegisterConductor"""),
}
COMMENT = {"typescript": re.compile(r"^\s*(//|\*|/\*)"), "go": re.compile(r"^\s*//")}


@pytest.mark.parametrize(("language", "pattern"), [("typescript", "src/**/*.ts"), ("go", "*.go")])
def test_the_typescript_and_go_clients_stay_off_dbos_proprietary_code(language: str, pattern: str) -> None:
    sources = sorted((CLIENTS / language).glob(pattern))
    assert sources, f"no {language} client sources found"
    for path in sources:
        code = [line for line in path.read_text().splitlines() if not COMMENT[language].match(line)]
        assert not [line for line in code if FORBIDDEN[language].search(line)], path
    assert FORBIDDEN["go"].search('import _ "go.dbos.dev/dbos-enterprise-go"')
    assert FORBIDDEN["typescript"].search("DBOS.setConfig({ conductorKey: key })")


CONDUCTOR_SETTINGS = ("conductor_key", "conductor_url")


def _conductor_settings(path: Path) -> list[ast.AST]:
    """Where the file names a conductor setting as a value or a keyword (a docstring that mentions one does not)."""
    return [n for n in _nodes(path) if (isinstance(n, ast.Constant) and n.value in CONDUCTOR_SETTINGS)
            or (isinstance(n, ast.keyword) and n.arg in CONDUCTOR_SETTINGS)]


def test_the_rule_catches_a_conductor_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('DBOS(config={"name": "a", "conductor_key": key})\nDBOS(config=c, conductor_url=u)\n')
    assert len(_conductor_settings(bad)) == 2
