"""Comments, docstrings and documents say the fact, never a tracker's number for it: "issue 24", "#34" or "stop 37"
mean something only to those who can look them up, and nothing once the tracker is gone. A reference fails here,
with the file and line, in the code, the tests, the build files, the README and docs/."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = {".py", ".ts", ".go", ".js", ".mjs", ".sh", ".yml", ".yaml", ".toml", ".cfg", ".ini", ".md", ".html",
            ".txt"}
NAMES = {"Makefile", "Dockerfile"}
# Not Relay's text: installed packages, caches, build output, recorded workflow histories, data dirs.
SKIPPED_DIRS = {".git", ".venv", "node_modules", "__pycache__", ".relay", ".relay-bench", "build", "histories",
                ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis", ".test-artifacts", "target", "bin"}
REFERENCE = re.compile(
    r"\bissues? ?(?:#|no\.? ?)?\d+"  # issue 24, issues 19, issue #12, Issue no. 3
    r"|\bstops? \d+\b"  # stop 37
    # #34; not an HTML entity, an anchor, or a colour (three or six digits: #333, #116329)
    r"|(?<![\w&#/:-])#(?!(?:\d{3}|\d{6})\b)\d+\b(?![\w.-])",
    re.IGNORECASE)
# This file states the patterns it looks for.
SELF = Path(__file__).resolve()
# Documents, as against the code: the README and the documentation site's pages.
DOCUMENTS = ("README.md", "docs/")


def _texts() -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        for name in files:
            path = Path(folder, name)
            if (path.suffix in SUFFIXES or name in NAMES) and path.resolve() != SELF:
                found.append(path)
    return sorted(found)


def _references(documents: bool) -> list[str]:
    out: list[str] = []
    for path in _texts():
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(DOCUMENTS) != documents:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            out.extend(f"{relative}:{number}: {match.group(0)!r} in {line.strip()[:100]}"
                       for match in REFERENCE.finditer(line))
    return out


@pytest.mark.parametrize("documents", [False, True], ids=["code", "readme-and-docs"])
def test_nothing_names_an_issue_by_its_number(documents: bool) -> None:
    references = _references(documents)
    assert not references, "say the fact instead:\n" + "\n".join(references)


@pytest.mark.parametrize("line", ["# issue 24: the 422", '"""Issue #12."""', "(see #34)", "at stop 37", "issues 19"])
def test_the_pattern_finds_a_reference(line: str) -> None:
    assert REFERENCE.search(line)


@pytest.mark.parametrize("line", ["color: #116329;", "page.html#section-2", "&#8594;", "stops the worker",
                                  "tissue 3", "stop_grace = 45", "127.0.0.1:8090/#/apps"])
def test_the_pattern_leaves_other_numbers_alone(line: str) -> None:
    assert not REFERENCE.search(line)
