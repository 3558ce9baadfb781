"""The image's venv, built here the way the Dockerfile builds it (there is no Docker engine on this machine): the
locked runtime installed hash-checked with --no-deps, Relay's wheel built by the locked backend from the build
context .dockerignore leaves, then installed --no-deps. From that venv alone, `relay gateway` and `relay worker`
serve against a Temporal dev server and record an executor HEALTHY, and `relay dev` says in one line that the dev
server is the `dev` extra. Real processes; pip's cache makes a second run fast."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Process, Relay, play_executor, ready, relay_env, start_temporal, wait_until
from tests.unit.test_image import ignored, requirements

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]
ROOT = Path(__file__).resolve().parents[2]


def pip(*args: str, python: Path | None = None) -> str:
    """This venv's pip, run against ``python``'s environment when given (as the Dockerfile's ``pip --python``)."""
    target = ["--python", str(python)] if python else []
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *target, *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"pip {' '.join(args)}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done.stdout


def build_context(destination: Path) -> None:
    """The checkout as `docker build` would send it: without what .dockerignore leaves out."""
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    for folder, subfolders, files in os.walk(ROOT):
        relative = Path(folder).relative_to(ROOT)
        subfolders[:] = [d for d in subfolders if not ignored(patterns, (relative / d).as_posix())]
        for name in files:
            if not ignored(patterns, (relative / name).as_posix()):
                (destination / relative).mkdir(parents=True, exist_ok=True)
                shutil.copy2(Path(folder) / name, destination / relative / name)


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Dockerfile's builder stage, step by step; returns the venv's bin folder."""
    tmp = tmp_path_factory.mktemp("image")
    venv, backend, source = tmp / "relay", tmp / "build", tmp / "src"
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # --no-compile: the Dockerfile's pip compiles every module's bytecode at install (the image's venv is read-only
    # to the user it runs as); here that is half a minute of CPU for modules no test imports, and the processes below
    # compile what they import.
    pip("install", "--require-hashes", "--no-deps", "--no-compile", "-r", str(ROOT / "requirements.lock"),
        python=python)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(backend)], check=True)
    pip("install", "--require-hashes", "--no-deps", "--no-compile", "-r", str(ROOT / "requirements-build.lock"),
        python=backend / "bin" / "python")
    source.mkdir()
    build_context(source)
    pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(tmp / "dist"), str(source),
        python=backend / "bin" / "python")
    (wheel,) = (tmp / "dist").glob("relay-*.whl")
    pip("install", "--no-deps", "--no-compile", str(wheel), python=python)
    return venv / "bin"


def test_venv_holds_the_lock_and_relay_only(image_venv: Path) -> None:
    python = image_venv / "python"
    pip("check", python=python)
    installed = {d["name"].lower().replace("_", "-") for d in json.loads(pip("list", "--format=json", python=python))}
    assert installed == {*requirements((ROOT / "requirements.lock").read_text()), "relay"}
    assert not (image_venv / "temporal").exists()
    where = subprocess.run([str(python), "-c", "import cli; print(cli.__file__)"], capture_output=True, text=True,
                           check=True, cwd=image_venv).stdout
    assert where.startswith(str(image_venv.parent)), where  # Relay from the wheel, not from the checkout


def test_relay_dev_without_the_dev_extra_says_so(image_venv: Path, tmp_path: Path) -> None:
    done = subprocess.run([str(image_venv / "relay"), "dev"], env=relay_env(tmp_path), capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "relay[dev]" in done.stderr, done.stderr


@pytest.fixture
def cluster(image_venv: Path, tmp_path: Path) -> Iterator[Relay]:
    """A Temporal dev server (this venv's `temporal`), then `relay worker` and `relay gateway` from the image's venv
    on SQLite; yields once the gateway is ready."""
    temporal, address = start_temporal(tmp_path)
    env = relay_env(tmp_path, RELAY_TEMPORAL_ADDRESS=address, RELAY_DATABASE_URL=f"sqlite:///{tmp_path / 'relay.db'}")
    processes = [temporal]
    url = f"http://127.0.0.1:{env['RELAY_PORT']}"
    try:
        for command in ("worker", "gateway"):
            processes.append(Process([str(image_venv / "relay"), command], env=env, log=tmp_path / f"{command}.log",
                                     cwd=tmp_path))
        try:
            wait_until(lambda: ready(url), timeout=60, what="gateway /readyz")
        except AssertionError:
            raise AssertionError("\n".join(p.output()[-2000:] for p in processes)) from None
        key = subprocess.run([str(image_venv / "relay"), "keys", "create"], env=env, check=True, capture_output=True,
                             text=True, cwd=tmp_path).stdout.strip()
        yield Relay(processes[-1], url, f"ws://127.0.0.1:{env['RELAY_PORT']}/", key, tmp_path, env)
    finally:
        for process in reversed(processes):
            process.stop()



def test_gateway_and_worker_serve_from_the_image_venv(cluster: Relay) -> None:
    with play_executor(cluster, "image-app", "ex-image"):
        wait_until(lambda: cluster.executors("image-app").get("ex-image") == "HEALTHY", timeout=20,
                   what="executor HEALTHY")
