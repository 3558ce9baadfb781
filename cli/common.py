"""What every command of the ``relay`` command line shares: durations and instants as typed, the REST client of one
org (``Api``, ``api_of``) and its errors, output (``emit``, ``say``), and the parser's kit: the client options,
the application given as an argument or as ``--app`` (``app_argument``), and one ``command`` builder."""

from __future__ import annotations

import argparse
import functools
import json
import re
import ssl
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn
from urllib.parse import quote

import httpx

from cli.tables import DURATION_UNITS, Json
from core.names import DEFAULT_ORG
from core.settings import Settings
from core.units import utcnow

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")

Handler = Callable[[argparse.Namespace, Settings], None]

def parse_duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``12h``, ``7d``, ``500ms`` or a sequence of them (``1h30m``); whole numbers only."""
    s = text.strip().lower()
    parts = _DURATION.findall(s)
    if not s or "".join(n + u for n, u in parts) != s:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (examples: 90s, 15m, 12h, 7d, 500ms)")
    try:
        return sum((timedelta(**{DURATION_UNITS[u]: int(n)}) for n, u in parts), timedelta())
    except OverflowError:
        raise argparse.ArgumentTypeError(f"duration {text!r} is too large") from None


def instant(text: str) -> datetime:
    """An ISO 8601 instant with its zone, or a duration meaning that long ago (``1h``)."""
    try:
        return utcnow() - parse_duration(text)
    except argparse.ArgumentTypeError:
        pass
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time or a duration: {text!r}") from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no time zone (add Z or +00:00)")
    return value


def fail(message: str) -> NoReturn:
    raise SystemExit(f"relay: {message}")  # printed on stderr, exit status 1


def problem_message(response: httpx.Response) -> str:
    """The problem+json ``detail`` and each of its ``errors``; the status line for any other body."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or not body.get("detail"):
        return f"HTTP {response.status_code} {response.reason_phrase}"
    errors = [e for e in body.get("errors") or [] if isinstance(e, dict)]
    return "\n".join([str(body["detail"]), *(f"  {e.get('location', '?')}: {e.get('message', '')}"
                                             f" (got {json.dumps(e.get('value'))})" for e in errors)])


def api_key(args: argparse.Namespace, settings: Settings) -> str | None:
    """--api-key, else RELAY_API_KEY (or the file RELAY_API_KEY_FILE names: ``Settings``)."""
    if getattr(args, "api_key", None):
        return str(args.api_key)
    return (settings.api_key.get_secret_value() or None) if settings.api_key is not None else None


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's default TLS context (its CA bundle, ``SSL_CERT_FILE``), made once per process: loading the CA
    bundle takes tens of milliseconds, and a client made without one would load it again."""
    return httpx.create_ssl_context()


class Api:
    """The REST API of one org, called with one key."""

    def __init__(self, url: str, key: str, org: str, *, timeout: float = 10.0) -> None:
        self.url, self.org = url.rstrip("/"), org
        self._client = httpx.Client(base_url=self.url, timeout=timeout, headers={"Authorization": f"Bearer {key}"},
                                    verify=_tls())

    def call(self, method: str, path: str, *, body: Json = None, params: dict[str, Any] | None = None) -> Json:
        response = self._request(method, path, body=body, params=params)
        if response.is_error:
            fail(problem_message(response))
        return response.json() if response.content else None

    def find(self, path: str) -> Json:
        """GET ``path``: its body, or None when it is not found (404)."""
        response = self._request("GET", path)
        if response.status_code == 404:
            return None
        if response.is_error:
            fail(problem_message(response))
        return response.json()

    def _request(self, method: str, path: str, *, body: Json = None,
                 params: dict[str, Any] | None = None) -> httpx.Response:
        try:
            return self._client.request(method, f"/v2/orgs/{quote(self.org, safe='')}{path}", json=body,
                                        params=params)
        except httpx.HTTPError as err:
            fail(f"cannot reach Relay at {self.url}: {err}")


def api_of(args: argparse.Namespace, settings: Settings) -> Api:
    key = api_key(args, settings)
    if key is None:
        fail("no API key: set RELAY_API_KEY (or RELAY_API_KEY_FILE) or pass --api-key")
    host = "127.0.0.1" if settings.host in ("", "0.0.0.0", "::") else settings.host  # a bind-all address
    return Api(args.url or f"http://{f'[{host}]' if ':' in host else host}:{settings.port}", key, args.org)


def path_part(value: str) -> str:
    return "/" + quote(value, safe="")


def emit(args: argparse.Namespace, data: Json, render: Callable[[Json], str]) -> None:
    print(json.dumps(data, indent=2) if args.output == "json" else render(data), flush=True)


def iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def client_options(p: argparse.ArgumentParser, *, org: bool = True) -> None:
    p.add_argument("--url", help="Relay's REST API (default: http://$RELAY_HOST:$RELAY_PORT)")
    p.add_argument("--api-key", help="API key (default: $RELAY_API_KEY)")
    if org:
        p.add_argument("--org", default=DEFAULT_ORG)
    p.add_argument("--output", "-o", choices=("table", "json"), default="table")


# A parser's default under this name is a check of what it parsed, run by ``cli.main.RelayParser`` right after it
# parsed: it may complete the namespace, and returns what is wrong (the parser's usage error), or None.
AFTER_PARSE = "after_parse"

def app_argument(p: argparse.ArgumentParser, *positional: str, variadic: str | None = None,
                 help: str = "the application") -> None:
    """The application a command is about, as ``--app NAME`` or as its first argument (``relay executors list
    orders``, ``relay workflows get orders <id>``), then the command's own ``positional`` arguments; or, for a
    command taking a list (``variadic``: ``relay workflows cancel [APP] ID...``), the list, whose first item is the
    application when --app is not given."""
    p.add_argument("--app", "-a", help=f"{help} (or give it as the first argument)")
    if variadic is None:
        p.add_argument("app_arg", nargs="?", metavar="APP", help=f"{help}, if not given as --app")
        for arg in positional:
            p.add_argument(arg)
    else:
        p.add_argument(variadic, nargs="+", metavar=variadic.removesuffix("s"),
                       help="one or more; without --app, the application comes first")
    p.set_defaults(**{AFTER_PARSE: lambda args: _take_app(args, variadic)})


def _take_app(args: argparse.Namespace, variadic: str | None) -> str | None:
    given = getattr(args, "app_arg", None)
    if variadic is not None and args.app is None:
        given, rest = getattr(args, variadic)[0], getattr(args, variadic)[1:]
        if not rest:
            return f"give the application and at least one {variadic.removesuffix('s')}, or --app"
        setattr(args, variadic, rest)
    if given is not None and args.app is not None and given != args.app:
        return f"the application is given twice: {given!r} and --app {args.app!r}"
    args.app = args.app or given
    return None if args.app else "the application is missing: give it as the first argument or as --app"




def app_path(args: argparse.Namespace) -> str:
    """The REST path of the application the command is about."""
    return "/apps" + path_part(args.app)


def say(args: argparse.Namespace, *lines: str) -> None:
    """What a command that answers with no body did, for a person; ``-o json`` prints nothing, as there is none."""
    if args.output == "table":
        print("\n".join(lines), flush=True)


def command(group: Any, name: str, handler: Handler, help: str, *positional: str, variadic: str | None = None,
            app_help: str = "the application") -> argparse.ArgumentParser:
    """A subcommand about one application: its handler, the client options, the application (argument or --app),
    then its own ``positional`` arguments (or a ``variadic`` list)."""
    p: argparse.ArgumentParser = group.add_parser(name, help=help)
    p.set_defaults(admin=handler)
    client_options(p)
    app_argument(p, *positional, variadic=variadic, help=app_help)
    return p
