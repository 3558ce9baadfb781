"""Relay on a secured Temporal: the dev server behind Debian's haproxy terminating TLS and requiring a client
certificate from a private CA (made here with Debian's openssl), reached through the SDK's ``TEMPORAL_TLS_*``
variables. `relay gateway` and `relay worker` start through it and a real DBOS executor's workflow is recovered by
its peer; without a client certificate, with the wrong CA or the wrong server name each exits 1 at once with one
line saying why; and `relay temporal setup` makes a new namespace usable, once, through the same mTLS."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support import (
    VENV_BIN,
    Process,
    dbos_executor,
    free_port,
    ready,
    registry,
    relay_env,
    start_temporal,
    wait_until,
    workflow_status,
)

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]  # outcomes only, waits sized for a busy machine
OPENSSL = "/usr/bin/openssl"
HAPROXY = "/usr/sbin/haproxy"
# A bad TLS setting must stop a process this soon (start-up included: a few seconds of imports on a busy machine).
REFUSED_WITHIN = 30.0


@dataclass(frozen=True)
class Pki:
    ca: Path
    other_ca: Path  # a CA the proxy does not know, and that did not sign its certificate
    server_bundle: Path  # haproxy's crt: certificate then key
    client_cert: Path
    client_key: Path


@dataclass(frozen=True)
class Secured:
    pki: Pki
    address: str  # the proxy: TLS, client certificate required
    tmp: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _key_and_request(name: str, subject: str, cwd: Path) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", subject, cwd=cwd)


def _sign(name: str, extensions: str, cwd: Path) -> None:
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=cwd)


def make_pki(cwd: Path) -> Pki:
    for ca, subject in (("ca", "/CN=Relay test CA"), ("other-ca", "/CN=Some other CA")):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
                 f"{ca}.key", "-out", f"{ca}.pem", "-days", "2", "-subj", subject, cwd=cwd)
    _key_and_request("server", "/CN=localhost", cwd)
    _sign("server", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n", cwd)
    _key_and_request("client", "/CN=relay", cwd)
    _sign("client", "extendedKeyUsage=clientAuth\n", cwd)
    bundle = cwd / "server-bundle.pem"
    bundle.write_text((cwd / "server.pem").read_text() + (cwd / "server.key").read_text())
    return Pki(cwd / "ca.pem", cwd / "other-ca.pem", bundle, cwd / "client.pem", cwd / "client.key")


def _accepts(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """The PKI, a Temporal dev server (Relay's search attributes registered) and haproxy in front of it."""
    tmp = tmp_path_factory.mktemp("tls")
    pki = make_pki(tmp)
    temporal, backend = start_temporal(tmp)
    port = free_port()
    config = tmp / "haproxy.cfg"
    config.write_text(f"""
defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h
frontend temporal_tls
    bind 127.0.0.1:{port} ssl crt {pki.server_bundle} ca-file {pki.ca} verify required alpn h2
    default_backend temporal
backend temporal
    server dev {backend}
""")
    proxy = Process([HAPROXY, "-db", "-f", str(config)], env=os.environ, log=tmp / "haproxy.log")
    try:
        wait_until(lambda: _accepts(f"127.0.0.1:{port}") and _accepts(backend), timeout=60, interval=0.2,
                   what="haproxy and the dev server")
        yield Secured(pki, f"127.0.0.1:{port}", tmp)
    finally:
        proxy.stop()
        temporal.stop()


def tls_env(secured: Secured, data_dir: Path, **overrides: str) -> dict[str, str]:
    """A `relay` environment that reaches Temporal only through the SDK's variables (none inherited)."""
    env = {k: v for k, v in relay_env(data_dir).items() if not k.startswith("TEMPORAL_")}
    env.update({
        "TEMPORAL_ADDRESS": secured.address,
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(secured.pki.ca),
        "TEMPORAL_TLS_CLIENT_CERT_PATH": str(secured.pki.client_cert),
        "TEMPORAL_TLS_CLIENT_KEY_PATH": str(secured.pki.client_key),
    })
    env.update(overrides)
    return {k: v for k, v in env.items() if v}  # an override of "" unsets the variable



def _secrets(pki: Pki) -> list[str]:
    """Lines of the private keys' bodies: none may appear in any output."""
    return [line for path in (pki.client_key, pki.server_bundle) for line in path.read_text().splitlines()
            if line and not line.startswith("-----")]


def test_gateway_and_worker_start_through_mtls_and_recover_a_dbos_workflow(secured: Secured, tmp_path: Path) -> None:
    env = tls_env(secured, tmp_path)
    relay = str(VENV_BIN / "relay")
    key = subprocess.run([relay, "keys", "create", "--init"], env=env, check=True, capture_output=True, text=True,
                         timeout=60).stdout.strip()
    url, ws_url = f"http://127.0.0.1:{env['RELAY_PORT']}", f"ws://127.0.0.1:{env['RELAY_PORT']}/"
    started = time.monotonic()
    worker = Process([relay, "worker"], env=env, log=tmp_path / "worker.log")
    gateway = Process([relay, "gateway"], env=env, log=tmp_path / "gateway.log")
    executors: list[Process] = []
    try:
        wait_until(lambda: ready(url) or gateway.popen.poll() is not None, timeout=60, what="gateway ready")
        gateway_ready = time.monotonic() - started
        wait_until(lambda: "worker running" in worker.output() or worker.popen.poll() is not None, timeout=60,
                   what="worker running")
        worker_ready = time.monotonic() - started
        assert gateway.popen.poll() is None and worker.popen.poll() is None, gateway.output() + worker.output()
        print(f"\nthrough mTLS, from start: gateway /readyz 200 after {gateway_ready:.1f} s, "
              f"worker running after {worker_ready:.1f} s")
        for process in (gateway, worker):
            assert "connected to Temporal at " + secured.address + ", namespace default, TLS on (server CA" \
                in process.output()

        app = "secured"
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=10) as api:
            api.put(f"/v2/orgs/local/apps/{app}").raise_for_status()
            api.patch(f"/v2/orgs/local/apps/{app}", json={"executorTimeoutSecs": 1}).raise_for_status()
        sys_db, go, steps = tmp_path / "sys.sqlite", tmp_path / "go", tmp_path / "steps"
        a = dbos_executor(ws_url, key, app, sys_db, tmp_path / "a.log", START_WORKFLOW="wf-1",
                          START_WORKFLOW_WHEN=str(go), STEP_SECONDS="0.2", STEP_LOG=str(steps))
        executors.append(a)
        # One at a time: two executors migrating a new SQLite system database at once can crash one.
        wait_until(lambda: list(registry(tmp_path, app).values()) == ["HEALTHY"], timeout=30, what="A HEALTHY")
        [a_id] = registry(tmp_path, app)
        executors.append(dbos_executor(ws_url, key, app, sys_db, tmp_path / "b.log", STEP_SECONDS="0.2",
                                       STEP_LOG=str(steps)))
        wait_until(lambda: list(registry(tmp_path, app).values()) == ["HEALTHY"] * 2, timeout=30, what="B HEALTHY")
        go.touch()
        wait_until(lambda: steps.exists() and len(steps.read_text().splitlines()) >= 2, timeout=20,
                   what="A ran 2 steps")
        a.kill()  # DISCONNECTED at once, DEAD a second later, then recovered by B
        wait_until(lambda: workflow_status(sys_db, "wf-1") == "SUCCESS", timeout=30, what="wf-1 finished on B")
        wait_until(lambda: a_id not in registry(tmp_path, app), timeout=10, what="A's record deleted")
        ran_by = {line.split()[0] for line in steps.read_text().splitlines()}
        assert len(ran_by) == 2 and str(a.pid) in ran_by, ran_by  # started on A, finished on B
    finally:
        for executor in executors:
            executor.stop()
        gateway.stop()
        worker.stop()
    output = gateway.output() + worker.output()
    assert not any(secret in output for secret in _secrets(secured.pki))


@pytest.mark.parametrize(("case", "overrides", "cause"), [
    ("no client certificate", {"TEMPORAL_TLS_CLIENT_CERT_PATH": "", "TEMPORAL_TLS_CLIENT_KEY_PATH": ""},
     "TLS handshake refused: the server requires a client certificate and none was sent"),
    ("wrong CA", {"TEMPORAL_TLS_SERVER_CA_CERT_PATH": "other-ca.pem"},
     "TLS: the server's certificate is signed by an unknown CA"),
    ("wrong server name", {"TEMPORAL_TLS_SERVER_NAME": "temporal.example"},
     "TLS: the server's certificate is not valid for the name temporal.example"),
])
def test_a_refused_tls_setting_stops_worker_and_gateway_with_one_line(
    secured: Secured, tmp_path: Path, case: str, overrides: dict[str, str], cause: str
) -> None:
    overrides = {k: str(secured.tmp / v) if v.endswith(".pem") else v for k, v in overrides.items()}
    env = tls_env(secured, tmp_path, **overrides)
    started = time.monotonic()
    processes = {name: Process([str(VENV_BIN / "relay"), name], env=env, log=tmp_path / f"{name}.log")
                 for name in ("worker", "gateway")}
    try:
        for name, process in processes.items():
            code = process.popen.wait(REFUSED_WITHIN - (time.monotonic() - started))
            lines = process.output().splitlines()
            assert code == 1 and lines, (name, code, lines)
            *retries, last = lines
            # One line says why, without a traceback. Before it, on a loaded machine, an attempt that timed out
            # ("operation was canceled") is rightly taken for an unreachable Temporal and retried, and says so.
            assert all(f"WARNING relay: Temporal at {secured.address} is unreachable (" in line and "retrying" in line
                       for line in retries), (name, retries, last)
            assert f"ERROR relay: cannot start: Temporal at {secured.address}: {cause}" in last, (retries, last)
            print(f"\n{case}, relay {name} after {time.monotonic() - started:.1f} s: {last}")
    finally:
        for process in processes.values():
            process.stop()


def test_setup_makes_a_new_namespace_usable_and_start_checks_it(secured: Secured, tmp_path: Path) -> None:
    env = tls_env(secured, tmp_path, RELAY_TEMPORAL_NAMESPACE="relay-secured")
    relay = str(VENV_BIN / "relay")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([relay, *args], env=env, capture_output=True, text=True, timeout=60)

    refused = run("worker")
    assert refused.returncode == 1, refused
    assert "lacks namespace relay-secured: run `relay temporal setup`" in refused.stderr, refused.stderr
    first, again = run("temporal", "setup"), run("temporal", "setup")
    assert first.returncode == 0 and again.returncode == 0, (first, again)
    assert "namespace relay-secured: created (retention 72 h)" in first.stdout, first.stdout
    assert "search attributes in relay-secured: added RelayOrg (Keyword), RelayApp (Keyword)" in first.stdout
    assert again.stdout.splitlines()[1:] == ["namespace relay-secured: exists",
                                            "search attributes in relay-secured: all 5 present"], again.stdout
