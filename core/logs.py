"""Logging set-up: text or JSON lines (``configure``), keys scrubbed from every record (they travel in the
WebSocket path), Relay's deliberate activity failures logged as one line each (not a traceback), and the Temporal
SDK's retry noise, while Temporal is unreachable, cut down to one line per kind per minute and a count of the
rest."""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from temporalio.runtime import PrometheusConfig

# Temporal's SDK is imported where it is used (it costs a third of a second): a `relay` command that only calls the
# REST API never loads it.

# The last path segment of /websocket/{app}/{key}, and any dbos_ key anywhere else in a message.
_WS_PATH = re.compile(r"(/websocket/[^/\s\"']+/)[^\s\"'?]+")
_KEY = re.compile(r"dbos_[A-Za-z0-9_\-]{8,}")


def scrub(text: str) -> str:
    return _KEY.sub("dbos_<redacted>", _WS_PATH.sub(r"\1<redacted>", text))


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# What a structured line carries besides its message, when the record has it (``log.info(..., extra={...})``):
# enough to follow one executor, one lifecycle workflow or one request across processes.
CONTEXT = ("org", "app", "executor_id", "workflow_id", "request_id")


class JsonLines(logging.Formatter):
    """One JSON object per record (``RELAY_LOG_FORMAT=json``): time (UTC, RFC 3339), level, logger, message, the
    ``CONTEXT`` fields the record has, and a traceback as ``exc``. Every value is scrubbed of keys again: a context
    value or a traceback may hold a path that the filters, which see only the message, did not."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, str] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        for name in CONTEXT:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = str(value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps({name: scrub(value) for name, value in line.items()}, ensure_ascii=False)


# Read from the environment before ``Settings`` is (``configure_from_environment``): a setting ``Settings`` refuses
# must already be said in the chosen format. Name, default and meaning (docs/pages/reference/settings.md lists them
# beside ``Settings``' own).
ENVIRONMENT: dict[str, tuple[str, str]] = {
    "RELAY_LOG_LEVEL": ("INFO", "The console log's level (a Python logging level name)."),
    "RELAY_LOG_FORMAT": ("text", "`text`: a line per record; `json`: one JSON object per line (`time`, `level`, "
                                 "`logger`, `message`, and `org`, `app`, `executor_id`, `workflow_id`, `request_id` "
                                 "when the line is about one), keys redacted in every field."),
}


def configure_from_environment() -> None:
    """``configure`` as ``RELAY_LOG_LEVEL`` and ``RELAY_LOG_FORMAT`` say."""
    setting = {name: os.environ.get(name, default) for name, (default, _) in ENVIRONMENT.items()}
    configure(level=setting["RELAY_LOG_LEVEL"], style=setting["RELAY_LOG_FORMAT"].lower())


def configure(*, level: str = "INFO", style: str = "text") -> None:
    """The root logger's one handler, on stderr: ``style`` "text" (a line per record) or "json" (``JsonLines``).
    Call it first thing in a process; uvicorn is told not to configure logging, so its lines come here too."""
    if style not in ("text", "json"):
        raise ValueError(f"RELAY_LOG_FORMAT must be text or json, not {style!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines() if style == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # Alembic narrates each revision it applies at INFO: a process starting on a new database would open with eight
    # lines of it (and a refusal that must be one line would not be). ``relay migrate`` says where it left the schema.
    logging.getLogger("alembic").setLevel(logging.WARNING)


class RedactKeys(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = scrub(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def install_redaction() -> None:
    """Attach the filter to the handlers of the loggers that may see a request path (and, while at it, make
    Relay's deliberate activity failures one line: ``OneLineActivityFailures``)."""
    redact = RedactKeys()
    for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access", "relay", "websockets"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactKeys) for f in logger.filters):
            logger.addFilter(redact)
        for handler in logger.handlers:
            if not any(isinstance(f, RedactKeys) for f in handler.filters):
                handler.addFilter(redact)
    activity = logging.getLogger(ACTIVITY_LOGGER)
    if not any(isinstance(f, OneLineActivityFailures) for f in activity.filters):
        activity.addFilter(OneLineActivityFailures())


class WarningsOnly(logging.LoggerAdapter[logging.Logger]):
    """A logger's warnings and errors, and nothing below: for a library's per-connection chatter."""

    def isEnabledFor(self, level: int) -> bool:
        return level >= logging.WARNING and self.logger.isEnabledFor(level)


class OncePerKey:
    """A warning logged the first time its key is seen in this process, not again: for a condition found again on
    every look (a stored row that cannot be read, skipped each time it is read). At most ``keep`` keys are kept."""

    def __init__(self, logger: logging.Logger, *, keep: int = 10_000) -> None:
        self._logger = logger
        self._keep = keep
        self._seen: set[str] = set()

    def warning(self, key: str, msg: str, *args: object) -> None:
        if key in self._seen:
            return
        if len(self._seen) >= self._keep:
            self._seen.clear()
        self._seen.add(key)
        self._logger.warning(msg, *args)


class OncePerWindow:
    """Relay's one way to throttle a report (a log line, an audit row): ``due(key)`` is True at most once per key
    per ``window`` and counts the rest in ``suppressed``. For a condition that repeats while it lasts: a database
    outage every activity meets, a flood of refused sockets, a signal retried for minutes. At most ``keep`` keys
    are remembered (ids in keys must not grow it without bound). Not thread-safe: one event loop, or a lock."""

    def __init__(self, window: timedelta, *, clock: Callable[[], float] = time.monotonic, keep: int = 10_000) -> None:
        self.window = window
        self.suppressed = 0
        self._clock = clock
        self._keep = keep
        self._last: dict[object, float] = {}

    def due(self, key: object = None) -> bool:
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.window.total_seconds():
            self.suppressed += 1
            return False
        if len(self._last) >= self._keep:
            self._last = {k: t for k, t in self._last.items() if now - t < self.window.total_seconds()}
        self._last[key] = now
        return True

    def forget(self, key: object = None) -> None:
        """The condition ended: its next occurrence is reported at once."""
        self._last.pop(key, None)


ACTIVITY_LOGGER = "temporalio.activity"  # the SDK's worker logs "Completing activity as failed" here


class OneLineActivityFailures(logging.Filter):
    """The Temporal worker logs every failed activity attempt with its traceback. An ``ApplicationError`` raised
    with no underlying exception is how Relay's activities fail on purpose (``gateway.activities`` turns a
    ``RelayError`` into one: a peer that has just gone, an executor that did not answer); its message is the
    reason and its traceback only the line that raised it, so one line with the type and reason is enough. Any
    other exception, a bug, keeps its traceback. So does an activity the SDK cancelled (the gateway's watch hold,
    timed out on the server while Temporal was away): the reason is all there is to say."""

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        if err is None:
            return True
        from temporalio.exceptions import ApplicationError, CancelledError

        if isinstance(err, ApplicationError) and err.__cause__ is None:
            record.msg, record.args = f"{record.getMessage()}: {err.type or 'ApplicationError'}: {err.message}", None
            record.exc_info, record.exc_text = None, None
        elif isinstance(err, (asyncio.CancelledError, CancelledError)):
            record.msg, record.args = f"{record.getMessage()}: cancelled ({err})", None
            record.exc_info, record.exc_text = None, None
        return True


# -- the Temporal SDK's logs ---------------------------------------------------------------------------------------

CORE_LOGGER = "temporalio.core"  # where the SDK's Rust core logs are forwarded to (see install_temporal_sdk_logging)
SUMMARY_LOGGER = "relay.sdk"
# Core prints a gRPC status as Rust debug text, in its message or its fields: `Status { code: Unavailable,
# message: "tcp connect error", source: Some(tonic::transport::Error(...)) }`, a few hundred characters.
_STATUS = re.compile(r"(?:Status \{ )?code: '?([^,']*)'?, message: \"([^\"]*)\"")
_DIGITS = re.compile(r"\d+")
_MAX_KINDS = 1024


def _compact_core_message(record: logging.LogRecord, core: object) -> None:
    """One short line for a forwarded Core record: its message, and for a gRPC error just the code and text."""
    message = str(record.msg)
    try:
        fields = getattr(core, "fields", None) or {}
    except Exception:  # the SDK documents that converting the fields may fail
        fields = {}
    extra = " ".join(str(v) for v in fields.values()) if isinstance(fields, dict) else str(fields)
    text = f"{message} {extra}".strip()
    status = _STATUS.search(text)
    if status:
        head = text[:status.start()] if status.start() < len(message) else message
        text = f"{head.rstrip(' :')}: {status[1]}: {status[2]}"
    record.msg, record.args = text[:300], None


class SdkLogThrottle(logging.Filter):
    """Lets through the first WARNING or ERROR of each kind from the Temporal SDK per ``window``; the rest are
    counted and reported in one line per window on ``relay.sdk``, so nothing disappears silently.

    While Temporal is unreachable every poller of every worker logs each retry (Core's ``temporalio_client::retry``
    warnings: several a second per worker, each a few hundred characters). Relay's own loggers (``relay.*``: the
    contact monitor's "unreachable" / "reachable again" lines, the embedded Temporal's supervisor) are never
    touched. A kind is, for Core, the module that logged it (``temporalio_client::retry``); for the Python side,
    the logger and the message template with its numbers blanked.
    """

    def __init__(self, *, window: timedelta = timedelta(minutes=1), clock: Callable[[], float] = time.monotonic,
                 report_on_timer: bool = True) -> None:
        super().__init__()
        self.window = window
        self._clock = clock
        self._report_on_timer = report_on_timer
        self._lock = threading.Lock()
        self._kinds = OncePerWindow(window, clock=clock, keep=_MAX_KINDS)
        self._suppressed = 0
        self._example = ""
        self._since = 0.0  # when the first of the unreported suppressions happened
        self._timer: threading.Timer | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if not (record.name == "temporalio" or record.name.startswith("temporalio.")):
            return True
        if not logging.WARNING <= record.levelno < logging.CRITICAL:
            return True
        decided = record.__dict__.get("relay_sdk_passed")  # a record reaches every handler: decide once
        if decided is None:
            decided = self._decide(record)
            record.__dict__["relay_sdk_passed"] = decided
        return bool(decided)

    def _decide(self, record: logging.LogRecord) -> bool:
        core = record.__dict__.get("temporal_log")
        if core is not None:  # a kind per Core module: its retry warnings name each gRPC call and count
            _compact_core_message(record, core)
            kind = (record.name, str(getattr(core, "target", "")))
        else:
            kind = (record.name, _DIGITS.sub("#", str(record.msg)))
        now = self._clock()
        with self._lock:
            if self._kinds.due(kind):
                return True
            if not self._suppressed:
                self._since, self._example = now, record.getMessage()[:200]
            self._suppressed += 1
            if self._report_on_timer and self._timer is None:
                self._timer = threading.Timer(self.window.total_seconds(), self.report)
                self._timer.daemon = True  # the atexit hook reports what is pending at exit
                self._timer.start()
        return False

    def take_summary(self) -> str | None:
        """The line reporting what was suppressed since the last one (None if nothing was); resets the count."""
        with self._lock:
            count, example, since = self._suppressed, self._example, self._since
            self._suppressed, self._example, self._timer = 0, "", None
        if not count:
            return None
        return (f"{count} Temporal SDK warnings suppressed in the last {self._clock() - since:.0f} s "
                f"(the first: {example})")

    def report(self) -> None:
        summary = self.take_summary()
        if summary:
            logging.getLogger(SUMMARY_LOGGER).warning(summary)


def install_temporal_sdk_logging(*, metrics: PrometheusConfig | None = None) -> SdkLogThrottle:
    """Route the SDK's Rust core logs through Python logging, and throttle the SDK's warnings on every handler of
    the root logger (the one ``relay``'s ``main`` configures).

    By default Core writes its own ANSI-coloured lines straight to stderr, past Python's format, filters and
    level. Forwarded, they are records on ``temporalio.core`` like any other. Call it once per process, before
    the first Temporal client: a client keeps the runtime it was made with.

    Args:
        metrics: Where the SDK serves its own Prometheus metrics, set on the same runtime.
    """
    from temporalio.runtime import LogForwardingConfig, LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

    forwarding = LogForwardingConfig(logger=logging.getLogger(CORE_LOGGER), append_target_to_name=False,
                                     prepend_target_on_message=False, append_log_fields_to_message=False)
    logging_config = LoggingConfig(filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
                                   forwarding=forwarding)
    Runtime.set_default(Runtime(telemetry=TelemetryConfig(logging=logging_config, metrics=metrics)),
                        error_if_already_set=False)
    throttle = _installed_throttle()
    if throttle is None:
        throttle = SdkLogThrottle()
        for handler in logging.getLogger().handlers:
            handler.addFilter(throttle)
        atexit.register(throttle.report)
    return throttle


def report_suppressed() -> None:
    """Log the summary of what the process's SDK log throttle holds back, now: for an exit that skips the atexit
    hooks (``core.temporal.exit_now``)."""
    throttle = _installed_throttle()
    if throttle is not None:
        throttle.report()


def _installed_throttle() -> SdkLogThrottle | None:
    """The throttle on the root logger's handlers (``install_temporal_sdk_logging``), if any."""
    return next((f for h in logging.getLogger().handlers for f in h.filters if isinstance(f, SdkLogThrottle)), None)


def recovery_dispatched(logger: logging.Logger, *, org: str, app: str, executor_id: str, workflow_id: str | None,
                        details: Mapping[str, object]) -> None:
    """The console line of an ``executor.recovery.dispatched`` row, said by the process that wrote it: the gateway as
    it sends the request, or the worker when the gateway could not (``details``: the row's, with the peer, the
    attempt and the request id)."""
    request_id = details.get("request_id")
    extra = {"org": org, "app": app, "executor_id": executor_id, "workflow_id": workflow_id,
             **({"request_id": request_id} if request_id else {})}
    logger.info("recovery of executor %s of %s/%s dispatched to %s (attempt %s)", executor_id, org, app,
                details.get("candidate"), details.get("attempt"), extra=extra)
