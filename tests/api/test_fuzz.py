"""schemathesis against Relay's own spec (api/spec/openapi.json), on the app in-process (``conftest.Api``): for
every operation, no 5xx and every response as the spec says (status code, content type, body schema), for inputs
valid and not.

The run uses its own org and key, so it cannot touch what other tests do in org ``local``; the key's name is
longer than a token name may be, so no ``DELETE /tokens/{tokenName}`` the fuzzer makes can revoke it.
"""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from sqlmodel import Session
from starlette.types import ASGIApp, Receive, Scope, Send

from api.schemas import TOKEN_NAME_MAX
from core.models import ApiKey
from core.store import KEY_PREFIX, hash_key
from tests.api.conftest import Api
from tests.api.test_management import QUEUE, FakeManagement, install
from tests.quick import QUICK, examples

SPEC = Path(__file__).parents[2] / "api" / "spec" / "openapi.json"
FUZZ_ORG = "fuzz"
MAX_EXAMPLES = examples(30)
# Chosen here rather than by the store: schemathesis builds some cases while collecting, before the store
# exists, and they need the credential already. The fixture below registers its hash.
FUZZ_KEY = KEY_PREFIX + secrets.token_urlsafe(32)
FUZZ_KEY_NAME = "fuzz-session-" + "k" * TOKEN_NAME_MAX  # too long for any tokenName in a request


def _pinned_to_fuzz_org(spec: dict[str, Any]) -> dict[str, Any]:
    """Every ``orgName`` is the fuzz org in generated valid requests (invalid ones still vary it)."""
    for path in spec["paths"].values():
        for operation in path.values():
            for param in operation.get("parameters", []):
                if param["name"] == "orgName":
                    param["schema"]["enum"] = [FUZZ_ORG]
    return spec


class AppUnderTest:
    """The app schemathesis sends every request to, its own probes included. The schema is built at import, so
    the cases can be collected, before the app and its store exist: this forwards to the app the fixture sets."""

    app: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.app is not None, "the fuzz_key fixture sets the app"
        await self.app(scope, receive, send)


APP = AppUnderTest()
# The coverage phase (every operation's edge cases, built while collecting) is skipped in `make check`'s quick run.
CONFIG = SchemathesisConfig.from_dict({"phases": {"coverage": {"enabled": not QUICK}}})
schema = schemathesis.openapi.from_dict(_pinned_to_fuzz_org(json.loads(SPEC.read_text())), config=CONFIG)
schema.app = APP  # requests go in-process, through schemathesis's ASGI transport


@schema.auth()
class FuzzKey:
    """Sends the fuzz key, except in the cases that test a missing or bad credential (schemathesis knows the
    spec's bearer scheme, so it still generates those)."""

    def get(self, case: schemathesis.Case[Any], context: schemathesis.AuthContext) -> str:
        return FUZZ_KEY

    def set(self, case: schemathesis.Case[Any], data: str, context: schemathesis.AuthContext) -> None:
        case.headers["Authorization"] = f"Bearer {data}"


@pytest.fixture(scope="module")
def fuzz_key(api: Api) -> str:
    with Session(api.store.engine) as s:
        s.add(ApiKey(org=FUZZ_ORG, name=FUZZ_KEY_NAME, key_hash=hash_key(FUZZ_KEY)))
        s.commit()
    # Management routes answer as a dbos executor would, whatever they are sent; its queues have a worker_concurrency,
    # so an autoscaling policy naming any of them is valid (one without is a 422 the schema cannot state).
    install(api, FakeManagement(replies={"get_queue": lambda f: {"output": {**QUEUE, "name": f["name"],
                                                                            "worker_concurrency": 1}}}))
    APP.app = api.app
    return FUZZ_KEY


def _outside_utc(value: object) -> bool:
    """A date-time the spec's format allows but Python cannot hold in UTC: year 1 with a positive offset, year 9999
    with a negative one. Relay answers those 422 "date-time out of range" (``tests/api/test_rest.py``); JSON Schema
    cannot say so, so the fuzz does not send them as valid data."""
    if isinstance(value, dict):
        return any(_outside_utc(v) for v in value.values())
    if isinstance(value, list):
        return any(_outside_utc(v) for v in value)
    if not isinstance(value, str) or value[:4] not in ("0001", "9999"):
        return False
    try:
        datetime.fromisoformat(value).astimezone(UTC)
    except ValueError:
        return False
    except OverflowError:
        return True
    return False


@schema.hook
def filter_case(context: schemathesis.HookContext, case: schemathesis.Case[Any]) -> bool:
    return not (_outside_utc(case.body) or _outside_utc(case.query))


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_spec(case: schemathesis.Case[Any], fuzz_key: str) -> None:
    case.call_and_validate()
