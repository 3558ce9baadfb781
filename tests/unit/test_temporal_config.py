"""How a process reaches Temporal (``core.temporal``): the SDK's ``TEMPORAL_*`` variables and TOML profiles reach
``Client.connect``, ``RELAY_TEMPORAL_*`` win, `relay dev`'s embedded server is never redirected by a stray
``TEMPORAL_ADDRESS``, and no key or certificate shows in what is logged or raised."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.service import TLSConfig

from core.settings import Settings
from core.temporal import (
    TemporalConnection,
    TemporalStartError,
    _cause,
    connect,
    reach,
    setup_instructions,
    temporal_connection,
)
from tests.support import LogRecords, free_port
from workflows.contracts.common import SEARCH_ATTRIBUTES

API_KEY = "eyJhbGciOiJFUzI1NiJ9.secret-api-key.c2lnbmF0dXJl"
PRIVATE_KEY = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgSECRETKEYMATERIAL\n" \
              "-----END PRIVATE KEY-----\n"
CERT = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUCERTIFICATEBODY\n-----END CERTIFICATE-----\n"


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Settings:
    """Settings from an environment with no RELAY_TEMPORAL_* set (the test's own process may have some)."""
    for name in ("RELAY_TEMPORAL_ADDRESS", "RELAY_TEMPORAL_NAMESPACE", "RELAY_TEMPORAL_PORT"):
        monkeypatch.delenv(name, raising=False)
    return Settings(data_dir=tmp_path)


@pytest.fixture
def pem_files(tmp_path: Path) -> dict[str, Path]:
    files = {"ca": tmp_path / "ca.pem", "cert": tmp_path / "client.pem", "key": tmp_path / "client.key"}
    files["ca"].write_text(CERT)
    files["cert"].write_text(CERT)
    files["key"].write_text(PRIVATE_KEY)
    return files


def connect_kwargs(conn: TemporalConnection, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What ``core.temporal.connect`` hands to ``Client.connect`` for ``conn`` (recorded, not sent)."""
    seen: dict[str, Any] = {}

    async def record(target_host: str, **kwargs: Any) -> Client:
        seen.update(kwargs, target_host=target_host)
        raise ConnectionAbortedError("recorded")

    monkeypatch.setattr(Client, "connect", record)
    with pytest.raises(ConnectionAbortedError):
        asyncio.run(connect(conn))
    return seen


def test_an_api_key_reaches_client_connect_with_tls_on(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = temporal_connection(settings, environ={
        "TEMPORAL_ADDRESS": "relay.a1b2c.tmprl.cloud:7233", "TEMPORAL_NAMESPACE": "relay.a1b2c",
        "TEMPORAL_API_KEY": API_KEY})
    kwargs = connect_kwargs(conn, monkeypatch)
    assert (kwargs["target_host"], kwargs["namespace"], kwargs["api_key"], kwargs["tls"]) == (
        "relay.a1b2c.tmprl.cloud:7233", "relay.a1b2c", API_KEY, True)


def test_mtls_files_and_server_name_reach_client_connect(settings: Settings, pem_files: dict[str, Path],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    conn = temporal_connection(settings, environ={
        "TEMPORAL_ADDRESS": "temporal.internal:7233", "TEMPORAL_TLS_CLIENT_CERT_PATH": str(pem_files["cert"]),
        "TEMPORAL_TLS_CLIENT_KEY_PATH": str(pem_files["key"]),
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(pem_files["ca"]), "TEMPORAL_TLS_SERVER_NAME": "temporal"})
    tls = connect_kwargs(conn, monkeypatch)["tls"]
    assert isinstance(tls, TLSConfig)
    assert (tls.client_cert, tls.client_private_key, tls.server_root_ca_cert, tls.domain) == (
        CERT.encode(), PRIVATE_KEY.encode(), CERT.encode(), "temporal")
    assert conn.api_key is None and conn.namespace == "default"


def test_a_toml_profile_is_read_and_env_variables_override_it(settings: Settings, pem_files: dict[str, Path],
                                                              tmp_path: Path) -> None:
    config = tmp_path / "temporal.toml"
    config.write_text(f"""
[profile.default]
address = "localhost:7233"

[profile.prod]
address = "prod.internal:7233"
namespace = "relay-prod"
[profile.prod.tls]
server_name = "prod"
client_cert_path = "{pem_files['cert']}"
client_key_path = "{pem_files['key']}"
""")
    env = {"TEMPORAL_CONFIG_FILE": str(config), "TEMPORAL_PROFILE": "prod"}
    conn = temporal_connection(settings, environ=env)
    assert (conn.address, conn.namespace) == ("prod.internal:7233", "relay-prod")
    assert isinstance(conn.tls, TLSConfig) and conn.tls.domain == "prod"
    assert conn.tls.client_private_key == PRIVATE_KEY.encode()
    # The SDK's order: a TEMPORAL_* variable overrides its profile's value.
    assert temporal_connection(settings, environ={**env, "TEMPORAL_NAMESPACE": "other"}).namespace == "other"
    assert temporal_connection(settings, environ={"TEMPORAL_CONFIG_FILE": str(config)}).address == "localhost:7233"


def test_relay_variables_win_over_temporal_ones(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RELAY_TEMPORAL_ADDRESS", "relay-side:7233")
    monkeypatch.setenv("RELAY_TEMPORAL_NAMESPACE", "relay-ns")
    conn = temporal_connection(Settings(data_dir=tmp_path), environ={
        "TEMPORAL_ADDRESS": "sdk-side:7233", "TEMPORAL_NAMESPACE": "sdk-ns", "TEMPORAL_API_KEY": API_KEY})
    assert (conn.address, conn.namespace, conn.api_key, conn.tls) == ("relay-side:7233", "relay-ns", API_KEY, True)


def test_nothing_set_is_plaintext_on_the_local_port(settings: Settings) -> None:
    conn = temporal_connection(settings, environ={})
    assert (conn.address, conn.namespace, conn.tls, conn.api_key) == ("127.0.0.1:7233", "default", False, None)


def test_temporal_address_alone_does_not_redirect_relay_dev(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A shell left pointing at another Temporal (even Cloud, with a key) leaves `relay dev` on its own server;
    RELAY_TEMPORAL_ADDRESS is what points it elsewhere, and then the SDK's variables apply."""
    for name in ("RELAY_TEMPORAL_ADDRESS", "RELAY_TEMPORAL_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RELAY_TEMPORAL_PORT", "17233")
    shell = {"TEMPORAL_ADDRESS": "relay.a1b2c.tmprl.cloud:7233", "TEMPORAL_NAMESPACE": "relay.a1b2c",
             "TEMPORAL_API_KEY": API_KEY}
    for name, value in shell.items():
        monkeypatch.setenv(name, value)
    dev = Settings(data_dir=tmp_path)
    assert dev.embedded_temporal
    conn = temporal_connection(dev, embedded=dev.embedded_temporal)  # what `relay dev` does (cli/serve.py)
    assert (conn.address, conn.namespace, conn.tls, conn.api_key) == ("127.0.0.1:17233", "default", False, None)

    monkeypatch.setenv("RELAY_TEMPORAL_ADDRESS", "staging:7233")
    external = Settings(data_dir=tmp_path)
    assert not external.embedded_temporal
    conn = temporal_connection(external, embedded=external.embedded_temporal)
    assert (conn.address, conn.namespace, conn.tls, conn.api_key) == ("staging:7233", "relay.a1b2c", True, API_KEY)


def test_the_connect_timeout_is_a_timedelta(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert Settings(data_dir=tmp_path).temporal_connect_timeout == timedelta(seconds=60)
    monkeypatch.setenv("RELAY_TEMPORAL_CONNECT_TIMEOUT_SECS", "2.5")
    assert Settings(data_dir=tmp_path).temporal_connect_timeout == timedelta(seconds=2.5)


@pytest.mark.parametrize(("environ", "expected"), [
    ({"TEMPORAL_CONFIG_FILE": "/nonexistent/temporal.toml"}, "TEMPORAL_CONFIG_FILE /nonexistent/temporal.toml does"),
    ({"TEMPORAL_PROFILE": "nope"}, "Profile 'nope' not found"),
    ({"TEMPORAL_TLS_CLIENT_CERT_PATH": "/nonexistent/client.pem", "TEMPORAL_TLS_CLIENT_KEY_PATH": "/nonexistent/k"},
     "TLS: cannot read the client certificate /nonexistent/client.pem: No such file or directory"),
])
def test_a_bad_configuration_says_what_is_wrong(settings: Settings, environ: dict[str, str], expected: str) -> None:
    with pytest.raises(TemporalStartError, match=expected.replace("(", r"\(").replace(".", r"\.")):
        temporal_connection(settings, environ=environ)


def test_a_certificate_needs_its_key(settings: Settings, pem_files: dict[str, Path]) -> None:
    with pytest.raises(TemporalStartError, match="client certificate needs its private key"):
        temporal_connection(settings, environ={"TEMPORAL_TLS_CLIENT_CERT_PATH": str(pem_files["cert"])})


def test_an_empty_variable_counts_as_unset(settings: Settings) -> None:
    conn = temporal_connection(settings, environ={"TEMPORAL_TLS_CLIENT_CERT_PATH": "", "TEMPORAL_API_KEY": ""})
    assert (conn.tls, conn.api_key) == (False, None)


def test_no_secret_in_the_repr_or_description(settings: Settings, pem_files: dict[str, Path]) -> None:
    conn = temporal_connection(settings, environ={
        "TEMPORAL_ADDRESS": "temporal.internal:7233", "TEMPORAL_API_KEY": API_KEY,
        "TEMPORAL_TLS_CLIENT_CERT_PATH": str(pem_files["cert"]), "TEMPORAL_TLS_CLIENT_KEY_PATH": str(pem_files["key"])})
    for shown in (repr(conn), str(conn), conn.describe(), f"{conn!r:}"):
        assert API_KEY not in shown and "SECRETKEYMATERIAL" not in shown and "CERTIFICATEBODY" not in shown
    assert conn.describe() == (f"temporal.internal:7233, namespace default, TLS on (client certificate "
                               f"{pem_files['cert']}, client key {pem_files['key']}), API key")


def test_a_toml_syntax_error_does_not_quote_the_key(settings: Settings, tmp_path: Path) -> None:
    """The SDK's loader quotes the offending line of a broken file: here the API key's."""
    config = tmp_path / "temporal.toml"
    config.write_text(f'[profile.default]\naddress = "a:7233"\napi_key = "{API_KEY}\n')
    with pytest.raises(TemporalStartError) as raised:
        temporal_connection(settings, environ={"TEMPORAL_CONFIG_FILE": str(config)})
    assert "TOML parse error" in str(raised.value) and API_KEY not in str(raised.value)


def test_retrying_an_unreachable_temporal_logs_no_key(settings: Settings) -> None:
    """A real connection attempt (TLS, with a key) to a port nothing listens on: retried, logged, given up; the
    key appears in no log line and not in the error."""
    records = LogRecords()
    logging.getLogger("relay").addHandler(records)
    conn = TemporalConnection(f"127.0.0.1:{free_port()}", tls=True, api_key=API_KEY)
    try:
        with pytest.raises(TemporalStartError) as raised:
            asyncio.run(reach(conn, timeout=timedelta(seconds=1)))
    finally:
        logging.getLogger("relay").removeHandler(records)
    message = str(raised.value)
    assert "unreachable for 1 s" in message and "Connection refused" in message, message
    lines = [r.getMessage() for r in records.records]
    assert lines and all("unreachable (Connection refused)" in line for line in lines), lines
    assert all(API_KEY not in text for text in [message, *lines])


# The SDK's connect errors as measured against haproxy (`verify required`) in front of a dev server.
_SDK = "Failed client connect: "
_AFTER = _SDK + "`get_system_info` call error after connection: Status { code: Unknown, message: \"transport " \
    "error\", source: Some(tonic::transport::Error(Transport, hyper::Error(Io, Custom { kind: InvalidData, error: "
_CONNECT = _SDK + "Server connection error: tonic::transport::Error(Transport, ConnectError(Custom { kind: " \
    "InvalidData, error: "


@pytest.mark.parametrize(("error", "tls", "permanent", "cause"), [
    (_AFTER + '"received fatal alert: CertificateRequired" }))) }', True, True,
     "the server requires a client certificate and none was sent"),
    (_AFTER + '"received fatal alert: UnknownCA" }))) }', True, True,
     "the server rejected the client certificate (alert UnknownCA)"),
    (_CONNECT + "InvalidCertificate(UnknownIssuer) }))", True, True,
     "the server's certificate is signed by an unknown CA"),
    (_CONNECT + 'InvalidCertificate(NotValidForNameContext { expected: DnsName("temporal.example"), presented: '
     '["DnsName(\\"localhost\\")", "IpAddress(127.0.0.1)"] }) }))', True, True,
     "the server's certificate is not valid for the name temporal.example"),
    (_CONNECT + "InvalidMessage(InvalidContentType) }))", True, True, "the server does not speak TLS on this port"),
    (_SDK + "Server connection error: tonic::transport::Error(Transport, PrivateKeyParseError)", True, True,
     "the client certificate or key cannot be used"),
    (_SDK + 'Server connection error: tonic::transport::Error(Transport, ConnectError(ConnectError("tcp connect '
     'error", 127.0.0.1:1, Os { code: 111, kind: ConnectionRefused, message: "Connection refused" })))', False, False,
     "Connection refused"),
    (_SDK + '`get_system_info` call error after connection: Status { code: Unauthenticated, message: "Request '
     'unauthorized." }', True, True, "credentials refused (Unauthenticated: Request unauthorized.)"),
])
def test_connect_errors_are_told_apart(error: str, tls: bool, permanent: bool, cause: str) -> None:
    got = _cause(RuntimeError(error), TemporalConnection("127.0.0.1:7233", tls=tls))
    assert got[0] is permanent and cause in got[1], got
    assert got[1].startswith("TLS") == (permanent and tls and "credentials" not in cause)


def test_the_key_is_scrubbed_from_a_connect_error() -> None:
    conn = TemporalConnection("127.0.0.1:7233", tls=True, api_key=API_KEY)
    error = RuntimeError(f'Status {{ code: Unauthenticated, message: "bad key {API_KEY}" }}')
    assert API_KEY not in _cause(error, conn)[1]


def test_setup_instructions_name_every_attribute_and_type() -> None:
    text = setup_instructions("relay.a1b2c")
    for name, kind in SEARCH_ATTRIBUTES.items():
        assert f"{name}  {kind}" in text and f"--search-attribute {name}={kind}" in text
