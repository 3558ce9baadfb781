"""docker-compose.temporal.yml stays consistent with the code: services, ports, search attributes, settings.

No Docker engine is needed: the file is parsed, not run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

from core.settings import Settings
from workflows.contracts.common import SEARCH_ATTRIBUTES

COMPOSE_FILE = Path(__file__).resolve().parents[2] / "docker-compose.temporal.yml"
SA_CREATOR = "temporal-search-attributes"
RELAY_SERVICES = ("relay-gateway", "relay-worker")
SA_CREATE = re.compile(r"search-attribute create\s+--name\s+(\S+)\s+--type\s+(\S+)")
RELAY_VAR = re.compile(r"\bRELAY_[A-Z0-9_]+\b")


@pytest.fixture(scope="module")
def text() -> str:
    return COMPOSE_FILE.read_text()


@pytest.fixture(scope="module")
def services(text: str) -> dict[str, dict[str, Any]]:
    parsed: dict[str, Any] = yaml.safe_load(text)
    return dict(parsed["services"])


def published_ports(service: dict[str, Any]) -> dict[int, int]:
    """Host port -> container port, from short ("8233:8080", "127.0.0.1:8233:8080/tcp") or long syntax."""
    ports: dict[int, int] = {}
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            ports[int(entry["published"])] = int(entry["target"])
        else:
            *_, host, container = str(entry).split("/")[0].split(":")
            ports[int(host)] = int(container)
    return ports


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        return dict(str(item).split("=", 1) for item in env)
    return {str(key): str(value) for key, value in env.items()}


def created_search_attributes(service: dict[str, Any]) -> list[tuple[str, str]]:
    script = " ".join(str(part) for key in ("entrypoint", "command") for part in service.get(key) or [])
    return SA_CREATE.findall(script)


def test_services_exist(services: dict[str, dict[str, Any]]) -> None:
    expected = {"postgresql", "temporal", SA_CREATOR, "temporal-ui", *RELAY_SERVICES}
    assert expected <= services.keys()


@pytest.mark.parametrize(
    ("service", "host", "container"),
    [("temporal", 7233, 7233), ("temporal-ui", 8233, 8080), ("relay-gateway", 8090, 8090)],
)
def test_published_ports(services: dict[str, dict[str, Any]], service: str, host: int, container: int) -> None:
    assert published_ports(services[service]).get(host) == container


def test_search_attributes_match_the_code(services: dict[str, dict[str, Any]]) -> None:
    creator = services[SA_CREATOR]
    assert str(creator["image"]).startswith("temporalio/admin-tools:")
    assert creator["depends_on"]["temporal"]["condition"] == "service_healthy"
    created = created_search_attributes(creator)
    assert len(created) == len(dict(created)), f"an attribute is created twice: {created}"
    assert dict(created) == SEARCH_ATTRIBUTES


def test_a_missing_search_attribute_is_noticed(services: dict[str, dict[str, Any]]) -> None:
    creator = dict(services[SA_CREATOR])
    creator["command"] = [line for line in creator["command"][0].splitlines() if "--name RelayOrg " not in line]
    assert dict(created_search_attributes(creator)) != SEARCH_ATTRIBUTES


@pytest.mark.parametrize("name", RELAY_SERVICES)
def test_relay_services_use_the_stack(services: dict[str, dict[str, Any]], name: str) -> None:
    env = environment(services[name])
    temporal_host, _, temporal_port = env["RELAY_TEMPORAL_ADDRESS"].rpartition(":")
    assert (temporal_host, temporal_port) == ("temporal", "7233")
    assert re.fullmatch(r"postgresql\+psycopg://[^@]+@postgresql(:5432)?/\w+", env["RELAY_DATABASE_URL"])
    assert name.removeprefix("relay-") in services[name]["command"]
    # PostgreSQL's driver comes with Relay's own `postgres` extra, not a pin of its own.
    installs = [line for line in services[name]["entrypoint"][2].splitlines() if "pip install" in line]
    assert len(installs) == 1 and installs[0].endswith("'/tmp/relay[postgres]'"), installs


def unknown_relay_variables(text: str) -> set[str]:
    """``RELAY_*`` names in ``text`` that pydantic-settings would not map onto a Settings field."""
    return {var for var in RELAY_VAR.findall(text) if var.removeprefix("RELAY_").lower() not in Settings.model_fields}


def test_relay_variables_are_settings(text: str) -> None:
    assert RELAY_VAR.search(text)
    assert not unknown_relay_variables(text), "not fields of core.settings.Settings"
    assert unknown_relay_variables(text + "\n# RELAY_TEMPORAL_HOST\n") == {"RELAY_TEMPORAL_HOST"}
