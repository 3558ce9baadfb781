"""The committed spec is what the app serves (`make openapi` rewrites it)."""

from __future__ import annotations

import json
from pathlib import Path

from api.openapi import render, spec

SPEC = Path(__file__).parents[2] / "api" / "spec" / "openapi.json"


def test_committed_spec_is_current() -> None:
    assert SPEC.read_text() == render(), "api/spec/openapi.json is stale: run `make openapi`"


def test_operation_ids_match_upstream() -> None:
    ops = {op["operationId"] for path in spec()["paths"].values() for op in path.values()}
    assert {"getApp", "updateApp", "registerApp", "listExecutors"} <= ops
    assert json.loads(SPEC.read_text())["paths"]["/v2/orgs/{orgName}/apps/{appName}"]["patch"]["operationId"] \
        == "updateApp"
