"""Imports between Relay's top-level packages point one way (README, "Code map"). A forbidden import fails here,
whether at module level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What each top-level package may import of Relay's own packages (itself always).
ALLOWED: dict[str, set[str]] = {
    "workflows": set(),
    "core": {"workflows"},
    "activities": {"core", "workflows"},
    "gateway": {"core", "workflows"},
    "api": {"core", "gateway", "workflows"},
    "worker": {"core", "activities", "workflows"},
    "cli": {"core", "api", "gateway", "worker", "workflows"},
}
# Deterministic workflow code re-imported by the sandbox: nothing that does I/O or serves requests.
WORKFLOWS_FORBIDDEN = {"fastapi", "starlette", "sqlalchemy", "sqlmodel", "websockets", "uvicorn", "httpx",
                       "psycopg", "requests", "socket", "sqlite3", "subprocess", "prometheus_client"}


def _sources(package: str) -> list[Path]:
    single = ROOT / f"{package}.py"
    return [single] if single.exists() else sorted((ROOT / package).rglob("*.py"))


def _imported(path: Path) -> set[str]:
    """Top-level names of every module the file imports, wherever the import statement is."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def violations(package: str, sources: list[Path]) -> list[str]:
    found = []
    for path in sources:
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
