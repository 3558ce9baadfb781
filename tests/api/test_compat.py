"""Compatibility with the upstream Conductor contract, for every operation Relay serves.

The facts below are read off the upstream OpenAPI document by hand (it is reference material, not vendored):
operation ids, methods, paths and success codes; path parameter patterns; request body properties; and, for
each response object, its properties' JSON types, which are required, and enum values. They are checked against
the spec Relay serves and against the app's responses (in-process, ``conftest.Api``). Relay-only properties must
be marked as extensions in Relay's spec (``x-relay-extension``); everything else must be as upstream says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import pytest

from api.app import create_app
from core.settings import Settings
from tests.api.conftest import BASE_URL, Api

STR, INT, BOOL, OBJ, ARR, NULL, NUM = "string", "integer", "boolean", "object", "array", "null", "number"


@dataclass(frozen=True)
class Shape:
    """An upstream object schema as facts: each property's JSON types (or nested shape), required ones, enums."""

    name: str
    properties: dict[str, frozenset[str] | Shape]
    required: frozenset[str]
    enums: dict[str, frozenset[str]] = field(default_factory=dict)
    date_times: frozenset[str] = frozenset()


def _types(*names: str) -> frozenset[str]:
    return frozenset(names)


STRING, INTEGER, BOOLEAN, ARRAY = _types(STR), _types(INT), _types(BOOL), _types(ARR)
STRING_OR_NULL, INTEGER_OR_NULL, OBJECT_OR_NULL = _types(STR, NULL), _types(INT, NULL), _types(OBJ, NULL)

AUDIT_SUBJECT = Shape("AuditSubject", {"type": STRING, "id": STRING, "display": STRING},
                      frozenset({"type", "id", "display"}), enums={"type": frozenset({"user", "api_key"})})
AUDIT_TARGET = Shape("AuditTarget", {"type": STRING, "id": STRING}, frozenset({"type", "id"}), enums={
    "type": frozenset({"application", "token", "role", "user", "organization", "workflow", "schedule",
                       "alerting_rule", "domain_claim"})})
ERROR_DETAIL = Shape("ErrorDetail", {"location": STRING, "message": STRING,
                                     "value": _types(STR, INT, BOOL, OBJ, ARR, NULL, NUM)}, frozenset())

UPSTREAM: dict[str, Shape] = {s.name: s for s in [
    Shape("Application", {
        "id": STRING, "name": STRING, "orgId": STRING, "status": STRING, "language": STRING_OR_NULL,
        "gcTimeThresholdMs": INTEGER_OR_NULL, "gcRowsThreshold": INTEGER_OR_NULL, "globalTimeoutMs": INTEGER_OR_NULL,
        "executorTimeoutSecs": INTEGER, "privateMode": BOOLEAN, "dbosCloud": BOOLEAN,
    }, frozenset({"id", "name", "orgId", "status", "language", "gcTimeThresholdMs", "gcRowsThreshold",
                  "globalTimeoutMs", "executorTimeoutSecs", "privateMode", "dbosCloud"}),
        enums={"status": frozenset({"AVAILABLE", "UNAVAILABLE"})}),
    Shape("Executor", {
        "executorId": STRING, "appId": STRING, "appVersion": STRING, "status": STRING, "hostId": STRING_OR_NULL,
        "hostname": STRING_OR_NULL, "createdAt": STRING, "updatedAt": STRING, "language": STRING_OR_NULL,
        "dbosVersion": STRING_OR_NULL, "executorMetadata": OBJECT_OR_NULL,
    }, frozenset({"executorId", "appId", "appVersion", "status", "hostId", "hostname", "createdAt", "updatedAt",
                  "language", "dbosVersion", "executorMetadata"}),
        enums={"status": frozenset({"HEALTHY", "DISCONNECTED", "DEAD"})},
        date_times=frozenset({"createdAt", "updatedAt"})),
    Shape("AuditLogEntry", {
        "id": STRING, "emitTime": STRING, "operation": STRING, "status": STRING, "subject": AUDIT_SUBJECT,
        "target": AUDIT_TARGET, "sourceIp": STRING, "details": OBJECT_OR_NULL,
    }, frozenset({"id", "emitTime", "operation", "status", "subject", "sourceIp", "details"}),
        enums={"status": frozenset({"success", "failure"})}, date_times=frozenset({"emitTime"})),
    Shape("Token", {"tokenName": STRING, "createdAt": STRING, "permissions": ARRAY, "appIds": ARRAY},
          frozenset({"tokenName", "createdAt", "permissions", "appIds"}), date_times=frozenset({"createdAt"})),
    Shape("TokenCreated", {"token": STRING, "tokenName": STRING}, frozenset({"token", "tokenName"})),
    Shape("ErrorModel", {"title": STRING, "status": INTEGER, "detail": STRING, "errors": _types(ARR, NULL),
                         "type": STRING, "instance": STRING}, frozenset()),
    AUDIT_SUBJECT, AUDIT_TARGET, ERROR_DETAIL,
]}

# Relay's additions, each of which Relay's spec must mark: properties, and values added to an upstream enum.
EXTENSION_PROPERTIES = {"Token": {"appNames"}, "Application": {"crossVersionRecovery"}, "Executor": {"gateway"},
                        "PatchAppInputBody": {"crossVersionRecovery"}}
EXTENSION_ENUM_VALUES = {("AuditSubject", "type"): {"system"}}

ORG = {"minLength": 3, "maxLength": 30, "pattern": "^[a-z0-9_]+$"}
APP = {"minLength": 3, "maxLength": 30, "pattern": "^[a-z0-9-_]+$"}


@dataclass(frozen=True)
class Operation:
    operation_id: str
    method: str
    path: str
    success: int
    response: str | None = None  # the success body: a Shape name, as an array when ``listed``
    listed: bool = False
    body: frozenset[str] = frozenset()  # upstream request body properties
    body_required: bool = False
    query: dict[str, str] = field(default_factory=dict)  # name -> JSON type


OPERATIONS = [
    Operation("listApps", "get", "/v2/orgs/{orgName}/apps", 200, "Application", listed=True),
    Operation("registerApp", "put", "/v2/orgs/{orgName}/apps/{appName}", 204, body=frozenset({"privateMode"})),
    Operation("getApp", "get", "/v2/orgs/{orgName}/apps/{appName}", 200, "Application"),
    Operation("updateApp", "patch", "/v2/orgs/{orgName}/apps/{appName}", 204, body_required=True, body=frozenset({
        "executorTimeoutSecs", "gcRowsThreshold", "gcTimeThresholdMs", "globalTimeoutMs", "privateMode"})),
    Operation("deleteApp", "delete", "/v2/orgs/{orgName}/apps/{appName}", 204),
    Operation("listExecutors", "get", "/v2/orgs/{orgName}/apps/{appName}/executors", 200, "Executor",
              listed=True),
    Operation("listAuditLogs", "get", "/v2/orgs/{orgName}/audit-logs", 200, "AuditLogEntry", listed=True,
              query={"startTime": STR, "endTime": STR, "operation": STR, "subject": STR, "target": STR,
                     "limit": INT, "offset": INT}),
    Operation("createToken", "post", "/v2/orgs/{orgName}/tokens/{tokenName}", 201, "TokenCreated",
              body=frozenset({"appNames", "permissions"})),
    Operation("listTokens", "get", "/v2/orgs/{orgName}/tokens", 200, "Token", listed=True),
    Operation("deleteToken", "delete", "/v2/orgs/{orgName}/tokens/{tokenName}", 204),
]


# -- checking a JSON value against the facts ------------------------------------------------------------------


def _json_type(value: Any) -> str:
    if value is None:
        return NULL
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int):
        return INT
    return {str: STR, float: NUM, dict: OBJ, list: ARR}[type(value)]


def conformance_errors(value: Any, shape: Shape, *, extra: frozenset[str] | set[str] = frozenset(),
                       extra_enum: dict[tuple[str, str], set[str]] | None = None, at: str = "") -> list[str]:
    """What in ``value`` breaks the upstream facts of ``shape`` (``extra``: allowed Relay-only properties)."""
    at = at or shape.name
    if not isinstance(value, dict):
        return [f"{at}: not an object: {value!r}"]
    errors = [f"{at}.{name}: required, missing" for name in shape.required - value.keys()]
    errors += [f"{at}.{name}: not an upstream property" for name in value.keys() - shape.properties.keys() - extra]
    for name, v in value.items():
        expected = shape.properties.get(name)
        if isinstance(expected, Shape):
            errors += conformance_errors(v, expected, extra_enum=extra_enum, at=f"{at}.{name}")
        elif expected is not None and _json_type(v) not in expected:
            errors.append(f"{at}.{name}: {_json_type(v)} {v!r}, upstream says {sorted(expected)}")
        allowed = shape.enums.get(name, set()) | (extra_enum or {}).get((shape.name, name), set())
        if name in shape.enums and v not in allowed:
            errors.append(f"{at}.{name}: {v!r} not in {sorted(allowed)}")
        if name in shape.date_times and not (isinstance(v, str) and _is_date_time(v)):
            errors.append(f"{at}.{name}: {v!r} is not an RFC 3339 date-time")
    return errors


def _is_date_time(text: str) -> bool:
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})", text):
        return False
    return datetime.fromisoformat(text).tzinfo is not None


def assert_upstream(value: Any, shape_name: str) -> None:
    shape = UPSTREAM[shape_name]
    errors = conformance_errors(value, shape, extra=EXTENSION_PROPERTIES.get(shape_name, set()),
                                extra_enum=EXTENSION_ENUM_VALUES)
    assert not errors, errors


def assert_problem(response: httpx.Response, status: int) -> dict[str, Any]:
    """An ``application/problem+json`` error in the upstream ``ErrorModel`` shape, with that status."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert_upstream(body, "ErrorModel")
    assert {"title", "status", "detail"} <= body.keys() and body["status"] == status
    for detail in body.get("errors") or []:
        assert_upstream(detail, "ErrorDetail")
    return body


def test_the_checker_can_fail() -> None:
    good = {"token": "dbos_x", "tokenName": "t"}
    assert not conformance_errors(good, UPSTREAM["TokenCreated"])
    assert conformance_errors({"token": "dbos_x"}, UPSTREAM["TokenCreated"])
    assert conformance_errors({**good, "secret": 1}, UPSTREAM["TokenCreated"])
    assert conformance_errors({**good, "token": 5}, UPSTREAM["TokenCreated"])
    assert conformance_errors({"type": "robot", "id": "x", "display": "x"}, AUDIT_SUBJECT)
    entry = {"id": "1", "emitTime": "2025-01-01 00:00:00", "operation": "o", "status": "success",
             "subject": {"type": "system", "id": "s", "display": "s"}, "sourceIp": "", "details": None}
    assert len(conformance_errors(entry, UPSTREAM["AuditLogEntry"])) == 2  # naive-ish time; "system"
    assert not conformance_errors({**entry, "emitTime": "2025-01-01T00:00:00Z"}, UPSTREAM["AuditLogEntry"],
                                  extra_enum=EXTENSION_ENUM_VALUES)


# -- the spec Relay serves --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def served_spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("spec")))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL) as client:
        response = await client.get("/openapi.json")
    assert response.status_code == 200
    spec: dict[str, Any] = response.json()
    return spec


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.operation_id)
def test_spec_has_the_upstream_operation(served_spec: dict[str, Any], op: Operation) -> None:
    spec_op = served_spec["paths"][op.path][op.method]
    assert spec_op["operationId"] == op.operation_id
    assert str(op.success) in spec_op["responses"]
    default = spec_op["responses"]["default"]["content"]
    assert list(default) == ["application/problem+json"]
    assert _resolve(served_spec, default["application/problem+json"]["schema"]) \
        == served_spec["components"]["schemas"]["ErrorModel"]
    for code, response in spec_op["responses"].items():
        if code.startswith(("4", "5")):
            assert list(response["content"]) == ["application/problem+json"], code
    params = {(p["in"], p["name"]): p for p in spec_op.get("parameters", [])}
    assert params[("path", "orgName")]["schema"].items() >= ORG.items()
    if "{appName}" in op.path:
        assert params[("path", "appName")]["schema"].items() >= APP.items()
    for name, json_type in op.query.items():
        assert params[("query", name)]["schema"]["type"] == json_type, name
    if op.body:
        body = spec_op["requestBody"]
        assert body.get("required", False) == op.body_required
        schema = _resolve(served_spec, body["content"]["application/json"]["schema"])
        assert op.body <= schema["properties"].keys()
        assert schema["additionalProperties"] is False  # unknown fields are refused, as upstream


@pytest.mark.parametrize("name", sorted(UPSTREAM))
def test_spec_schema_requires_what_upstream_requires(served_spec: dict[str, Any], name: str) -> None:
    schema = served_spec["components"]["schemas"][name]
    shape = UPSTREAM[name]
    assert shape.required <= set(schema.get("required", [])), name
    relay_only = schema["properties"].keys() - shape.properties.keys()
    marked = {p for p, s in schema["properties"].items() if s.get("x-relay-extension") is True}
    assert relay_only == marked == EXTENSION_PROPERTIES.get(name, set())
    for (schema_name, prop), values in EXTENSION_ENUM_VALUES.items():
        if schema_name == name:
            assert set(schema["properties"][prop]["x-relay-extension-enum"]) == values


# -- responses --------------------------------------------------------------------------------------------------


async def test_every_operation_answers_as_upstream_says(api: Api) -> None:
    """One pass through every operation with valid input: status codes and bodies as upstream says."""
    org, app = "/v2/orgs/local", "/v2/orgs/local/apps/compat-app"
    expect = {op.operation_id: op for op in OPERATIONS}
    async with api.client() as client:

        async def call(operation_id: str, path: str, **kwargs: Any) -> httpx.Response:
            op = expect[operation_id]
            response = await client.request(op.method.upper(), path, **kwargs)
            assert response.status_code == op.success, (operation_id, response.text)
            if op.response is None:
                assert response.content == b""
            else:
                assert response.headers["content-type"] == "application/json"
                for item in response.json() if op.listed else [response.json()]:
                    assert_upstream(item, op.response)
            return response

        await call("registerApp", app, json={"privateMode": False})
        api.record("compat-app", "compat-ex")
        await call("getApp", app)
        await call("updateApp", app, json={"executorTimeoutSecs": 30, "gcTimeThresholdMs": 86_400_000})
        assert len((await call("listExecutors", f"{app}/executors")).json()) == 1
        assert any(a["name"] == "compat-app" for a in (await call("listApps", f"{org}/apps")).json())
        created = (await call("createToken", f"{org}/tokens/compat-token", json={"appNames": ["compat-app"]})).json()
        assert created["tokenName"] == "compat-token" and created["token"].startswith("dbos_")
        tokens = (await call("listTokens", f"{org}/tokens")).json()
        assert all("token" not in t for t in tokens)
        await call("deleteToken", f"{org}/tokens/compat-token")
        entries = (await call("listAuditLogs", f"{org}/audit-logs", params={"limit": 1000})).json()
        assert {"app.registered", "app.updated", "token.created", "token.deleted", "executor.healthy"} \
            <= {e["operation"] for e in entries}
        await call("deleteApp", app)


@pytest.mark.parametrize(("method", "path", "status", "without_key"), [
    ("GET", "/v2/orgs/local/apps/no-such-app", 404, 401),
    ("GET", "/v2/orgs/no_such_org/apps", 404, 401),
    ("GET", "/v2/orgs/local/apps/UPPER", 422, 401),
    ("GET", "/v2/orgs/x/apps", 422, 422),  # a malformed path is refused before the key is looked at
    ("PATCH", "/v2/orgs/local/apps/compat-errors", 422, 401),
    ("GET", "/v2/orgs/local/audit-logs?limit=lots", 422, 401),
    ("DELETE", "/v2/orgs/local/tokens/no-such-token", 404, 401),
    ("POST", "/v2/orgs/local/apps", 405, 405),
    ("GET", "/v2/nowhere", 404, 404),
])
async def test_errors_are_upstream_error_models(api: Api, method: str, path: str, status: int,
                                                without_key: int) -> None:
    async with api.client() as client:
        await client.put("/v2/orgs/local/apps/compat-errors")
        assert_problem(await client.request(method, path), status)
    async with api.anonymous() as anonymous:
        assert_problem(await anonymous.request(method, path), without_key)
