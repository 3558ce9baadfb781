"""HTTP errors as ``application/problem+json`` in the upstream ``ErrorModel`` shape, for every route."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from gateway.errors import RelayError

log = logging.getLogger("relay.gateway")
PROBLEM_JSON = "application/problem+json"


def problem(status: int, title: str, detail: str, errors: list[dict[str, Any]] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"title": title, "status": status, "detail": detail}
    if errors is not None:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON)


def relay_problem(err: RelayError) -> JSONResponse:
    return problem(err.status, err.title, err.detail)


def install(app: FastAPI) -> None:
    @app.exception_handler(RelayError)
    async def _relay(_request: Request, err: RelayError) -> JSONResponse:
        return relay_problem(err)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, err: RequestValidationError) -> JSONResponse:
        errors = [
            {"location": ".".join(str(p) for p in e["loc"]), "message": e["msg"], "value": _safe(e.get("input"))}
            for e in err.errors()
        ]
        return problem(422, "Unprocessable Entity", "validation failed", errors)

    @app.exception_handler(HTTPException)
    async def _http(_request: Request, err: HTTPException) -> JSONResponse:
        return problem(err.status_code, str(err.detail), str(err.detail))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem(500, "Internal Server Error", "unexpected error; see the gateway log")


def _safe(value: Any) -> Any:
    """Echo scalars and small structures back; anything else as its type name."""
    if value is None or isinstance(value, bool | int | float | str | list | dict):
        return value
    return type(value).__name__
