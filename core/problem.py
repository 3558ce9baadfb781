"""The problem body (RFC 9457, the upstream ``ErrorModel``) as bytes: for answers written below the REST app (an
executor upgrade refused, a request head too large), byte for byte what the REST app's problem responses carry."""

from __future__ import annotations

import json
from typing import Any

PROBLEM_JSON = "application/problem+json"


def problem_body(status: int, title: str, detail: str, errors: list[dict[str, Any]] | None = None) -> bytes:
    body: dict[str, Any] = {"title": title, "status": status, "detail": detail}
    if errors is not None:
        body["errors"] = errors
    # Starlette's JSONResponse renders the same way: compact, UTF-8, no NaN.
    return json.dumps(body, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()
