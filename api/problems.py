"""HTTP errors as ``application/problem+json`` in the upstream ``ErrorModel`` shape, for every route — and in
the spec: every operation documents a ``default`` problem response and the specific codes it can return."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException
from starlette.routing import Match

from core.errors import RelayError, ServiceUnavailableError
from core.problem import PROBLEM_JSON
from core.store import outage, unavailable

log = logging.getLogger("relay.gateway")
# An echoed value longer than this (as JSON) is replaced by a shortened string: errors must stay small.
MAX_ECHO = 200
MAX_DETAIL = 500  # a 422's detail: the first invalid field and its message, cut to this many characters


class ErrorDetail(BaseModel):
    """Upstream ``ErrorDetail``."""

    model_config = ConfigDict(extra="forbid")

    location: str
    message: str
    value: Any


class ErrorModel(BaseModel):
    """Upstream ``ErrorModel`` (RFC 9457 problem details)."""

    model_config = ConfigDict(extra="forbid")

    title: str
    status: int
    detail: str
    errors: list[ErrorDetail] | None = None


def problem(status: int, title: str, detail: str, errors: list[dict[str, Any]] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"title": title, "status": status, "detail": detail}
    if errors is not None:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON)


def relay_problem(err: RelayError) -> JSONResponse:
    tried = getattr(err, "tried", None)  # a management request: the executors it was sent to, in order
    errors = [{"location": "executors", "message": "executors tried", "value": tried}] if tried else None
    return problem(err.status, err.title, err.detail, errors)


_REF = {"$ref": "#/components/schemas/ErrorModel"}


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """FastAPI ``responses=`` for an operation: ``default`` and each of ``codes`` as a problem."""
    out: dict[int | str, dict[str, Any]] = {"default": {"description": "Error",
                                                        "content": {PROBLEM_JSON: {"schema": _REF}}}}
    for code in codes:
        out[code] = {"description": HTTPStatus(code).phrase, "content": {PROBLEM_JSON: {"schema": _REF}}}
    return out


def install(app: FastAPI) -> None:
    @app.exception_handler(RelayError)
    async def _relay(_request: Request, err: RelayError) -> JSONResponse:
        return relay_problem(err)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        if isinstance(err.body, bytes) and err.body:  # not read as JSON: see ``_not_json``
            return _not_json(request.headers.get("content-type"))
        details = _details(err)
        return problem(422, "Unprocessable Entity", _summary(details), details)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, err: HTTPException) -> JSONResponse:
        response = problem(err.status_code, _phrase(err.status_code), str(err.detail))
        if err.headers:
            response.headers.update(err.headers)
        if err.status_code == 405:
            response.headers["Allow"] = ", ".join(_allowed_methods(request))
        return response

    @app.exception_handler(DBAPIError)
    @app.exception_handler(PoolTimeoutError)
    async def _database(request: Request, err: Exception) -> JSONResponse:
        # The database stopped, restarting or locked is not a bug: 503, and one line in the log, not a traceback.
        if not unavailable(err):
            return await _unexpected(request, err)
        log.warning("database unavailable on %s %s: %s", request.method, request.url.path, outage(err))
        return relay_problem(ServiceUnavailableError("Relay's database is unavailable; retry shortly"))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem(500, "Internal Server Error", "unexpected error; see the gateway log")

    app.openapi = _with_problem_schemas(app.openapi)  # type: ignore[method-assign]


def _not_json(content_type: str | None) -> JSONResponse:
    """415 for a body FastAPI did not read as JSON because it came as another media type (``curl -d`` sends
    ``application/x-www-form-urlencoded``) or with none: FastAPI hands such a body to validation as bytes, which
    answers 422 "Input should be a valid dictionary" and names no cause. Every body Relay takes is JSON."""
    sent = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
    return problem(415, "Unsupported Media Type",
                   f"the request body must be JSON, sent with Content-Type: application/json ({sent} was sent)")


def _with_problem_schemas(generate: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """The responses above refer to ``ErrorModel`` by ``$ref`` (FastAPI would otherwise list it under
    ``application/json``): add it and ``ErrorDetail`` to the components. Also undo two FastAPI habits."""

    def openapi() -> dict[str, Any]:
        spec = generate()  # FastAPI builds it once and caches it; doing this again is a no-op
        schema = ErrorModel.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas = spec.setdefault("components", {}).setdefault("schemas", {})
        schemas.update(schema.pop("$defs", {}))
        schemas["ErrorModel"] = schema
        _integral_bounds(spec)
        _non_null_queries(spec)
        return spec

    return openapi


def _integral_bounds(node: Any) -> None:
    """FastAPI's OpenAPI models type ``minimum``/``maximum`` as floats: write integral ones back as integers."""
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, float) and value.is_integer() and key in _BOUNDS:
                node[key] = int(value)
            else:
                _integral_bounds(value)
    elif isinstance(node, list):
        for item in node:
            _integral_bounds(item)


_BOUNDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}


def _non_null_queries(spec: dict[str, Any]) -> None:
    """An optional query parameter is absent or a value, never null, but FastAPI writes ``X | None`` as
    ``anyOf: [X, null]``: keep X (a client would otherwise send ``?startTime=null``)."""
    for path in spec.get("paths", {}).values():
        for operation in path.values():
            for param in operation.get("parameters", []):
                schema = param.get("schema", {})
                branches = [b for b in schema.get("anyOf", []) if b != {"type": "null"}]
                if param.get("in") == "query" and len(branches) == 1 and len(schema["anyOf"]) == 2:
                    del schema["anyOf"]
                    schema.update(branches[0])


def _details(err: RequestValidationError) -> list[dict[str, Any]]:
    """Pydantic's errors as upstream ``ErrorDetail``s, without the duplicates of a parameter that two
    dependencies both declare (``orgName`` is validated by the route and by the auth dependency)."""
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for e in err.errors():
        location, message, value = _location(e.get("loc", ())), str(e.get("msg", "")), e.get("input")
        if e.get("type") == "json_invalid":  # pydantic's loc is ("body", <character offset>)
            location, message, value = "body", f"invalid JSON: {e.get('ctx', {}).get('error', '')}", None
        if (location, message) not in seen:
            seen.add((location, message))
            out.append({"location": location, "message": message, "value": _safe(value)})
    return out


def _summary(details: list[dict[str, Any]]) -> str:
    """The first invalid field and why, as the problem's ``detail``: what a person reads first (the CLI prints it
    before the ``errors``), so it must say what is wrong, not only that something is."""
    if not details:
        return "validation failed"
    first = details[0]
    text = f"{first['location']}: {str(first['message']).removeprefix('Value error, ')}"
    more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
    return text[:MAX_DETAIL - len(more)] + more


def _allowed_methods(request: Request) -> list[str]:
    """Every method the path supports. Starlette's 405 names only those of the first route that matched the path,
    but each method of ``/apps/{appName}`` is a route of its own."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return sorted(methods)


def _location(loc: Sequence[Any]) -> str:
    """``body.items[3].tags`` / ``path.appName``, as upstream writes locations."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _safe(value: Any) -> Any:
    """Echo the offending value back when it is small, JSON-safe data; otherwise a shortened text of it."""
    try:
        text = json.dumps(value, allow_nan=False)  # inf and nan (from 1e999 in a body) are not JSON
    except (TypeError, ValueError, RecursionError):
        return repr(value)[:MAX_ECHO] if isinstance(value, bytes | float) else type(value).__name__
    try:  # the response is UTF-8: a lone surrogate (valid in JSON text, "\\ud800") cannot be echoed as it is
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return text[:MAX_ECHO]
    return value if len(text) <= MAX_ECHO else text[:MAX_ECHO] + "…"
