"""The README's and the documentation's commands, as written: every `relay` and `curl` command of their fenced `sh`
blocks that talks to Relay is run in a shell against a `relay dev` of this module's own, and must succeed (exit 0, no
traceback; curl with ``--fail-with-body``, so an HTTP error fails it). A block fenced `shell` is shown as an example
in a situation this machine cannot stage (a fleet of executors, Kubernetes, Docker, Temporal Cloud); of those, each
line that can run here anyway is run too (``test_an_example_runs_where_it_can``): a `relay` command that needs no
executor and has no placeholder, on its app registered, and a `temporal workflow list` or `temporal schedule` line,
on the dev server's Temporal.

What a block needs of the world is what the README says around it: the `relay` CLI and a Python with dbos on PATH,
``RELAY_API_KEY`` set (the dev key), the gateway's port instead of the default 8090 (``RELAY_PORT``, and in the text
of each command and of ``app.py``). The blocks of one section (a page's
"## " heading) run in order, in one directory, on what the ones before left; each section starts on an org with no
apps. Placeholders (``<rule id>``) are filled in from what the
commands before made; an unknown one fails the test, naming it.

"Try a recovery by hand" is run as a person would: ``app.py`` from the README's Python block, executor A
(``python app.py start``), B once A is connected, A killed with SIGKILL mid-workflow, B finishing the workflow,
``relay audit --follow`` printing the recovery as it lands; then its start-over block, and the walkthrough's first
steps again (the app registers anew and the workflow runs from its first step).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support import VENV_BIN, Process, Relay, running_relay, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]

README = Path(__file__).parents[2] / "README.md"
DOCS = README.parent / "docs" / "pages"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
DEFAULT_ADDRESS = "127.0.0.1:8090"  # the README's gateway address: this module's own port instead
# `relay` subcommands that call the REST API (the others start processes or talk to Temporal or the database).
API_COMMANDS = {"apps", "executors", "audit", "keys", "workflows", "queues", "schedules", "versions", "drain",
                "recovery", "alerts"}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
PLACEHOLDER = re.compile(r"<[^<>\s][^<>]*>")


@dataclass(frozen=True)
class Block:
    section: str  # the page, and the "## " heading it is under: "README.md: Alerts"
    line: int  # where it starts in the README
    language: str
    commands: list[str]  # one a line, continuation lines joined; comment lines kept


def readme_blocks(text: str, page: str = "README.md") -> list[Block]:
    blocks = []
    for match in FENCE.finditer(text):
        before = text[:match.start()]
        headings = re.findall(r"^## (.+)$", before, re.M)
        lines = [line.strip() for line in match.group(2).replace("\\\n", " ").splitlines() if line.strip()]
        blocks.append(Block(f"{page}: {headings[-1] if headings else ''}", before.count("\n") + 1, match.group(1),
                            lines))
    return blocks


def talks_to_relay(command: str) -> bool:
    words = command.split()
    return bool(words) and (words[0] == "curl" or (words[0] == "relay" and len(words) > 1 and words[1] in API_COMMANDS))


# `relay` subcommands that need a connected executor to answer (an app's workflows, queues, schedules, versions).
NEEDS_EXECUTOR = {"workflows", "queues", "schedules", "versions"}


def runs_here(command: str) -> bool:
    """A `shell` example's line that this machine can run: see the module's docstring."""
    words = command.split()
    if not words or PLACEHOLDER.search(command) or "$" in command:
        return False
    if words[0] == "relay":
        return len(words) > 1 and words[1] in API_COMMANDS - NEEDS_EXECUTOR
    return words[0] == "temporal" and words[1:3] in (["workflow", "list"], ["schedule", "describe"],
                                                     ["schedule", "toggle"], ["schedule", "trigger"],
                                                     ["schedule", "backfill"])


def _examples() -> list[tuple[str, str]]:
    """(page and line, command) of every `shell` example's line that runs here."""
    out = []
    for page in PAGES:
        for block in readme_blocks(page.read_text(), str(page.relative_to(README.parent))):
            if block.language == "shell":
                out += [(f"{block.section} (line {block.line})", c.split("  #")[0].strip())
                        for c in block.commands if runs_here(c)]
    return out


def _sections() -> dict[str, list[Block]]:
    """The sections whose `sh` blocks hold a command that talks to Relay, and those blocks, in page order."""
    out: dict[str, list[Block]] = {}
    for block in (b for page in PAGES for b in readme_blocks(page.read_text(), str(page.relative_to(README.parent)))):
        if block.language == "sh" and any(talks_to_relay(c) for c in block.commands):
            out.setdefault(block.section, []).append(block)
    return out


SECTIONS = _sections()
EXAMPLES = _examples()
WALKTHROUGH = "README.md: Try a recovery by hand"


def test_the_readme_blocks_are_found() -> None:
    """The parser finds what this module runs (a page reworded beyond it would otherwise run nothing)."""
    assert WALKTHROUGH in SECTIONS, SECTIONS.keys()
    assert len({section.split(":")[0] for section in SECTIONS} - {"README.md"}) >= 4, SECTIONS.keys()
    commands = [c for blocks in SECTIONS.values() for b in blocks for c in b.commands if talks_to_relay(c)]
    assert len(commands) >= 15, commands
    assert any(c.startswith("curl ") and "Content-Type: application/json" in c for c in commands), commands


@pytest.fixture(scope="module")
def readme_relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    # The orphan sweep's schedule exists, as in production, for the runbook's `temporal schedule trigger`; a month
    # apart, it never fires by itself here (and an hour's minimum age finds nothing).
    with running_relay(tmp_path_factory.mktemp("relay-readme"), RELAY_ORPHAN_SWEEP_INTERVAL_SECS="2592000") as relay:
        yield relay


class Shell:
    """Runs README lines as a person in one directory would: the README's environment, its placeholders filled
    in, and the gateway's port for the default one."""

    def __init__(self, relay: Relay, cwd: Path) -> None:
        self.relay, self.cwd = relay, cwd
        self.address = relay.url.removeprefix("http://")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        self.env.update(PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", RELAY_API_KEY=relay.key,
                        RELAY_HOST="127.0.0.1", RELAY_PORT=self.address.rsplit(":", 1)[1],
                        RELAY_DATA_DIR=str(relay.data_dir))
        self.values = {"<a key>": relay.key, "<the dev key>": relay.key, "<relay checkout>": str(README.parent)}
        self.background: list[Process] = []

    def text(self, command: str) -> str:
        command = command.replace(DEFAULT_ADDRESS, self.address)
        for placeholder in PLACEHOLDER.findall(command):
            assert placeholder in self.values, f"README placeholder {placeholder} has no value here: {command}"
            command = command.replace(placeholder, self.values[placeholder])
        if command.startswith("curl "):
            command += " --fail-with-body -sS"  # as written it would exit 0 on an HTTP error
        return command

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["bash", "-c", self.text(command)], cwd=self.cwd, env=self.env, capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, (command, done.returncode, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, (command, done.stderr)
        return done

    def start(self, command: str, name: str) -> Process:
        """A long-running line (an executor, ``--follow``), in the background; stopped by PID at the end."""
        process = Process(["bash", "-c", "exec " + self.text(command)], env=self.env, log=self.cwd / f"{name}.log",
                          cwd=self.cwd)
        self.background.append(process)
        return process

    def interrupt(self, process: Process) -> str:
        """Ctrl-C, as a person ends ``--follow``: it must exit 0. Its output."""
        os.kill(process.pid, signal.SIGINT)
        assert process.popen.wait(timeout=10) == 0, process.output()
        return process.output()

    def stop_all(self) -> None:
        for process in self.background:
            process.stop()


@pytest.fixture
def shell(readme_relay: Relay, tmp_path: Path) -> Iterator[Shell]:
    """A shell on an org with no apps (each section starts afresh)."""
    with readme_relay.api() as client:
        for app in client.get("/v2/orgs/local/apps").raise_for_status().json():
            client.delete(f"/v2/orgs/local/apps/{app['name']}").raise_for_status()
    opened = Shell(readme_relay, tmp_path)
    try:
        yield opened
    finally:
        opened.stop_all()


def _run_block(shell: Shell, block: Block) -> None:
    """Every line of a block in turn; ``--follow`` in the background until the block's end, which it must have
    printed as it landed."""
    follows = []
    for command in block.commands:
        if command.startswith("#"):
            continue
        if "--follow" in command.split():
            follows.append(shell.start(command, f"follow-{block.line}"))
            wait_until(lambda p=follows[-1]: "OPERATION" in p.output(), timeout=30, what=f"{command}: its header")
            continue
        out = shell.run(command).stdout
        if command.startswith("relay alerts create"):
            shell.values["<rule id>"] = out.split()[-1]  # "created WorkflowFailure rule <id>"
    for follow in follows:
        printed = shell.interrupt(follow)
        assert len(printed.splitlines()) >= 2, printed  # the header, and the entries of the block so far


@pytest.mark.parametrize("section", sorted(set(SECTIONS) - {WALKTHROUGH}))
def test_a_section_runs_as_written(shell: Shell, section: str) -> None:
    for block in SECTIONS[section]:
        _run_block(shell, block)


def test_the_examples_that_run_here_are_found() -> None:
    assert len(EXAMPLES) >= 15, EXAMPLES
    assert any(c.startswith("temporal ") for _, c in EXAMPLES) and any(c.startswith("relay ") for _, c in EXAMPLES)


@pytest.mark.parametrize(("where", "command"), EXAMPLES, ids=[f"{w}: {c}" for w, c in EXAMPLES])
def test_an_example_runs_where_it_can(shell: Shell, where: str, command: str) -> None:
    """The example's app is registered (no executor connects), and `temporal` talks to the dev server."""
    for app in re.findall(r"--(?:app|target) (\S+)", command) + re.findall(r"^relay \S+ (?:\S+ )?(orders)\b", command):
        shell.run(f"relay apps register {app}")
    shell.env.update(TEMPORAL_ADDRESS=shell.relay.temporal_address, TEMPORAL_NAMESPACE="default")
    shell.run(command)


# -- the walkthrough ---------------------------------------------------------------------------------------------

RECOVERY_OPERATIONS = ["executor.disconnected", "executor.dead", "executor.recovery.dispatched",
                       "executor.recovery.succeeded", "executor.deleted"]


def _app_py(shell: Shell) -> None:
    """``app.py``, saved from the walkthrough's Python block as the README says."""
    text = README.read_text()
    start = text.index("## " + WALKTHROUGH.split(": ", 1)[1])
    source = next(m.group(2) for m in FENCE.finditer(text, start) if m.group(1) == "python")
    (shell.cwd / "app.py").write_text(source.replace(DEFAULT_ADDRESS, shell.address))


def _steps(process: Process) -> list[int]:
    return [int(n) for n in re.findall(r"^step (\d+)$", process.output(), re.M)]


def _connected(process: Process) -> bool:
    return "Connected to DBOS conductor" in process.output()


def test_the_walkthrough_recovers_and_starts_over(shell: Shell) -> None:
    _app_py(shell)
    walkthrough, *after = SECTIONS[WALKTHROUGH]
    executors: dict[str, Process] = {}
    follow: Process | None = None
    for command in walkthrough.commands:
        if command.startswith("python app.py start"):
            executors["A"] = shell.start(command, "executor-a")
            wait_until(lambda: _connected(executors["A"]), timeout=60, what="A: Connected to DBOS conductor")
        elif command.startswith("python app.py"):
            executors["B"] = shell.start(command, "executor-b")
            wait_until(lambda: _connected(executors["B"]), timeout=60, what="B: Connected to DBOS conductor")
        elif command.startswith("# kill -9 A"):
            wait_until(lambda: len(_steps(executors["A"])) >= 3, timeout=30, what="A in the middle of the steps")
            executors["A"].kill()
            done = _steps(executors["A"])
            assert done[-1] < 19, done
            wait_until(lambda: 19 in _steps(executors["B"]), timeout=60, what="B prints the remaining steps")
            assert set(_steps(executors["B"])) <= set(range(done[-1], 20)), (done, _steps(executors["B"]))
        elif "--follow" in command.split():
            follow = shell.start(command, "follow")
            wait_until(lambda p=follow: "OPERATION" in p.output(), timeout=30, what="relay audit --follow's header")
        elif talks_to_relay(command):
            if command.startswith("relay executors list"):  # A's record is deleted once its recovery is confirmed
                wait_until(lambda: len(shell.relay.executors("orders")) == 1, timeout=30, what="A deleted")
                rows = shell.run(command).stdout.splitlines()[1:]
                assert [row.split()[1] for row in rows] == ["HEALTHY"], rows
            else:
                shell.run(command)
        else:
            raise AssertionError(f"a line of the walkthrough this test does not know: {command!r}")
    assert set(executors) == {"A", "B"} and follow is not None
    printed = shell.interrupt(follow)
    operations = [line.split()[2] for line in printed.splitlines()[1:]]
    assert [op for op in operations if op in RECOVERY_OPERATIONS] == RECOVERY_OPERATIONS, printed

    # Run again as it is, it does nothing new: say so, then start over as the README says.
    executors["B"].stop()
    register = next(c for c in walkthrough.commands if c.startswith("relay apps register"))
    refused = subprocess.run(["bash", "-c", shell.text(register)], cwd=shell.cwd, env=shell.env, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 1 and "already registered" in refused.stderr, refused
    assert after, "the start-over block"
    for block in after:
        _run_block(shell, block)
    assert not list(shell.cwd.glob("orders-sys.sqlite*"))
    shell.run(register)
    again = shell.start(next(c for c in walkthrough.commands if c.startswith("python app.py start")), "again")
    wait_until(lambda: 0 in _steps(again), timeout=60, what="demo-1 runs again from its first step")


# -- what `make run` prints, and where the gateway's address leads -------------------------------------------------


def test_the_banner_names_the_console_and_the_docs_and_the_root_leads_to_the_console(readme_relay: Relay) -> None:
    output = readme_relay.process.output()
    assert f"console:       {readme_relay.url}/console\n" in output, output[-3000:]
    assert f"API docs:      {readme_relay.url}/docs\n" in output, output[-3000:]
    assert not [line for line in output.splitlines() if "alembic" in line.lower()], output[-3000:]
    response = httpx.get(readme_relay.url + "/", timeout=10, follow_redirects=True)
    assert response.status_code == 200 and response.url.path == "/console"
    assert "Relay Console" in response.text
    docs = httpx.get(readme_relay.url + "/docs", timeout=10)
    assert docs.status_code == 200 and "swagger-ui" in docs.text
