"""What ``relay temporal setup`` does (``cli.temporal_setup`` parses it): Relay's namespace and search attributes
(``core.types.SEARCH_ATTRIBUTES``) created in the Temporal the environment names, where missing, and looked at again
until the server shows them. A module of its own so that Temporal's modules load when the command runs, not with
every `relay` command's parser.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from typing import Any

from google.protobuf.duration_pb2 import Duration
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from core.settings import Settings
from core.temporal import (
    INDEXED_TYPES,
    TemporalConnection,
    TemporalStartError,
    exit_now,
    reach,
    search_attributes,
    setup_instructions,
    temporal_connection,
)
from core.types import SEARCH_ATTRIBUTES

# A namespace just registered, or an attribute just added, reaches the frontend's caches (and Elasticsearch's
# mapping) a few seconds after it is written: look again this often, for this long.
_SETTLE_EVERY = timedelta(milliseconds=500)
_SETTLE_FOR = timedelta(seconds=30)


class SetupRefused(Exception):
    """The server will not let Relay create what it needs; the message says what to create by hand."""


def _refused(err: Exception) -> bool:
    """A refusal that means "not through this API here" (Temporal Cloud), not "try again"."""
    return isinstance(err, RPCError) and err.status in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNIMPLEMENTED)


def setup(retention: timedelta, settings: Settings) -> None:
    """`relay temporal setup`, as the environment and ``settings`` name Temporal; exits 0 or, refused, 1."""
    try:
        asyncio.run(_run(temporal_connection(settings), retention, settings.temporal_connect_timeout))
    except (TemporalStartError, SetupRefused, RPCError) as err:
        why = f"Temporal answered {err.status.name}: {err.message}" if isinstance(err, RPCError) else str(err)
        print(f"relay temporal setup: {why}", file=sys.stderr)
        exit_now(1)
    exit_now(0)


async def _run(conn: TemporalConnection, retention: timedelta, timeout: timedelta) -> None:
    client = await reach(conn, timeout=timeout)
    print(f"Temporal at {conn.describe()}", flush=True)
    print(await ensure_namespace(client, conn.namespace, retention), flush=True)
    print(await ensure_search_attributes(client, conn.namespace), flush=True)


async def ensure_namespace(client: Client, namespace: str, retention: timedelta) -> str:
    """Register ``namespace`` unless it exists; what was done, in a line."""
    try:
        await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))
        return f"namespace {namespace}: exists"
    except RPCError as err:
        if _refused(err):
            return f"namespace {namespace}: not readable here ({err.status.name}); assumed to exist"
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
    try:
        await client.workflow_service.register_namespace(RegisterNamespaceRequest(
            namespace=namespace, workflow_execution_retention_period=Duration(seconds=int(retention.total_seconds()))))
    except RPCError as refused:
        if _refused(refused):
            raise SetupRefused(f"the server refuses to create namespace {namespace} ({refused.status.name}): create it "
                               f"yourself, then run this again\n{setup_instructions(namespace)}") from None
        if refused.status != RPCStatusCode.ALREADY_EXISTS:  # created meanwhile by another run: as good
            raise
    await _settle(lambda: _namespace_visible(client, namespace), f"namespace {namespace} to be usable")
    return f"namespace {namespace}: created (retention {retention.total_seconds() / 3600:g} h)"


async def ensure_search_attributes(client: Client, namespace: str) -> str:
    """Add Relay's search attributes missing from ``namespace``; what was done, in a line."""
    present = await search_attributes(client, namespace)
    if present is None:
        raise SetupRefused(f"the server refuses the operator API here (Temporal Cloud?): "
                           f"{setup_instructions(namespace)}")
    wrong = {name: kind for name, kind in SEARCH_ATTRIBUTES.items() if name in present and present[name] != kind}
    if wrong:
        raise SetupRefused("search attributes exist with another type (a type cannot change): " + ", ".join(
            f"{name} is {present[name]}, Relay needs {kind}" for name, kind in wrong.items()))
    missing = {name: kind for name, kind in SEARCH_ATTRIBUTES.items() if name not in present}
    if not missing:
        return f"search attributes in {namespace}: all {len(SEARCH_ATTRIBUTES)} present"
    try:
        await client.operator_service.add_search_attributes(AddSearchAttributesRequest(
            namespace=namespace, search_attributes={name: INDEXED_TYPES[kind] for name, kind in missing.items()}))
    except RPCError as err:
        if _refused(err):
            raise SetupRefused(f"the server refuses to add search attributes ({err.status.name}): "
                               f"{setup_instructions(namespace, missing)}") from None
        if err.status != RPCStatusCode.ALREADY_EXISTS:
            raise

    async def all_present() -> bool:
        now = await search_attributes(client, namespace) or {}
        return all(now.get(name) == kind for name, kind in missing.items())

    await _settle(all_present, f"search attributes {', '.join(missing)} to appear")
    return f"search attributes in {namespace}: added {', '.join(f'{n} ({k})' for n, k in missing.items())}"


async def _namespace_visible(client: Client, namespace: str) -> bool:
    try:
        return await search_attributes(client, namespace) is not None
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return False
        raise


async def _settle(done: Any, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _SETTLE_FOR.total_seconds()
    while not await done():
        if loop.time() > deadline:
            raise SetupRefused(f"gave up waiting for {what} after {_SETTLE_FOR}")
        await asyncio.sleep(_SETTLE_EVERY.total_seconds())
