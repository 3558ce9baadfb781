"""The documentation's generated reference pages (docs/reference.py) say what the code says: a setting, command,
metric, audit operation or REST operation added, changed or removed without `make reference` fails here."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from core.audit_events import AUDIT_EVENTS
from core.metrics import CATALOGUE, EXECUTORS, REGISTRY

ROOT = Path(__file__).parents[2]
PRODUCT = ["core", "gateway", "api", "activities", "workflows", "cli", "worker.py"]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "docs" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REFERENCE = _generator()


@pytest.mark.parametrize("name", sorted(REFERENCE.PAGE_MAKERS))
def test_a_reference_page_says_what_the_code_says(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", str(REFERENCE.HELP_COLUMNS))
    page = REFERENCE.PAGES / name
    committed = page.read_text()
    if name == "cli.md":  # argparse's help layout differs between Python releases: compared on the one it names
        rendered_with = re.search(r"rendered with Python (\d+)\.(\d+)", committed)
        assert rendered_with is not None
        if tuple(map(int, rendered_with.groups())) != sys.version_info[:2]:
            pytest.skip(f"the CLI page was rendered with Python {'.'.join(rendered_with.groups())}")
    assert committed == REFERENCE.PAGE_MAKERS[name](), f"{page} is out of date: run `make reference`"


def _product_files() -> list[Path]:
    files: list[Path] = []
    for entry in PRODUCT:
        path = ROOT / entry
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def _audit_operations_in_code() -> set[str]:
    """Every string literal of the product that has the shape of an audit operation of a known kind."""
    kinds = {operation.split(".", 1)[0] for operation in AUDIT_EVENTS}
    shape = re.compile(rf"^({'|'.join(map(re.escape, kinds))})\.[a-z_]+(\.[a-z_]+)?$")
    found = set()
    for path in _product_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and shape.match(node.value):
                found.add(node.value)
    # Names of the same shape that are not operations: the console's pages and Python modules.
    return {name for name in found if not name.endswith((".html", ".js", ".css"))
            and not name.startswith("workflows.") and name.split(".")[0] != "core"}


def test_every_audit_operation_the_code_writes_is_in_the_catalogue_and_every_entry_is_written() -> None:
    in_code = _audit_operations_in_code()
    assert len(in_code) >= 50, sorted(in_code)
    assert in_code - AUDIT_EVENTS.keys() == set(), "add these to core/audit_events.py"
    assert AUDIT_EVENTS.keys() - in_code == set(), "no code writes these any more: remove them"


def test_every_metric_relay_registers_is_in_the_catalogue() -> None:
    registered = {family.name for family in REGISTRY.collect()
                  if not family.name.startswith(("python_", "process_"))}
    catalogued = {m.name.removesuffix("_total") if m.kind == "counter" else m.name for m in CATALOGUE}
    assert len(catalogued) == len(CATALOGUE), "a metric catalogued twice"
    # relay_executors is registered by the process that counts it in its database (``ExecutorsCollector``).
    assert registered | {EXECUTORS} == catalogued, (registered | {EXECUTORS}) ^ catalogued
