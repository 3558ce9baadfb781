"""Print the gateway's OpenAPI document (``make openapi`` writes it to api/spec/openapi.json)."""

from __future__ import annotations

import json
from typing import Any

from api.app import create_app
from core.settings import Settings


def spec() -> dict[str, Any]:
    return create_app(Settings()).openapi()


def render() -> str:
    return json.dumps(spec(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(render(), end="")
